/* The prefix cache: exact checkpoints of the engine state, indexed by the
 * token ids that led to them, shared by all of the scheduler's slots.
 *
 * A Gated DeltaNet state cannot be rewound, so a prompt can only resume
 * from a state taken after exactly one of its prefixes. The index is a
 * radix tree (a compressed trie: each edge a run of token ids); a node may
 * hold a checkpoint, a tern_snapshot taken after exactly the tokens on the
 * path from the root. A lookup finds the deepest checkpoint whose path
 * starts the prompt.
 *
 * Each checkpoint holds a reference on its base: the nearest checkpoint
 * above it when it was inserted (the state it was taken after, which a
 * later engine change lets it share KV rows with). A checkpoint is evicted
 * only once nothing holds it, so descendants always go before ancestors.
 *
 * Eviction (when the checkpoints' bytes exceed the budget) is GreedyDual-
 * Size: LRU weighted by value. A checkpoint's value is the prefill it saves
 * beyond its base (its depth minus the base's), per byte it holds. Each has
 * a priority H = L + value, set when it is inserted or hit; the evictable
 * checkpoint with the lowest H goes first (the least recently used on a
 * tie) and L rises to its H, so a checkpoint not used for a while loses to
 * newer ones, faster the less it saves per byte. A long shared prefix (a
 * system prompt) is held by every checkpoint of a conversation after it,
 * so it goes only after all of them; and a use of a checkpoint (a hit, or
 * a checkpoint added below it) refreshes its bases too, so the prefix is
 * then as recent as the conversation used last.
 *
 * Tiers. A checkpoint is taken into the memory the engine runs in. On a
 * GPU that is device memory, the fastest to restore from; when the device
 * tier is over its budget, its victims move to host memory (the RAM tier,
 * page-locked, restored from there over the host link), and the RAM tier's
 * victims go to disk or are dropped. On the CPU checkpoints start in RAM.
 *
 * The disk tier (pcache_attach_disk) takes what the RAM budget evicts: a
 * victim is written to its file (spilled) and keeps its place in the tree,
 * on disk, instead of being dropped; the disk tier evicts by the same rule
 * within its own budget. A checkpoint that shares its base's KV rows is
 * held in memory only while its base is, and a file holds only its own bytes,
 * so a checkpoint read back from disk needs its bases read first (root to
 * leaf). A file that fails verification drops its checkpoint and every one
 * continuing its rows. The disk tier outlives the process: at a clean exit
 * pcache_persist moves what is in memory to disk and writes the tree's
 * index beside the files; pcache_adopt_disk at the next start puts those
 * checkpoints back in the tree, on disk.
 *
 * Not thread-safe: the scheduler's thread owns it; the statistics have
 * their own lock (pcache_stats may be called from any thread). */
#ifndef TERN_SERVER_PCACHE_H
#define TERN_SERVER_PCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "server/pcdisk.h"
#include "tern.h"

typedef struct pcache pcache;
typedef struct pc_node pc_node;

/* Bytes of checkpoints held at most in device memory (vram_budget; 0: a
 * GPU's checkpoints go to host memory at once) and in host memory
 * (ram_budget). NULL when out of memory. */
pcache *pcache_create(size_t vram_budget, size_t ram_budget);
void pcache_destroy(pcache *c);
/* Gives the cache a disk tier of budget bytes (the cache owns d from now). */
void pcache_attach_disk(pcache *c, pcdisk *d, size_t budget);
/* The checkpoints an earlier process left in the disk tier (its index),
 * back in the tree, on disk, within the budget; every other file of the
 * model deleted. The count adopted, or -1 with err (the index unreadable:
 * the files are deleted). */
int pcache_adopt_disk(pcache *c, tern_error *err);
/* For a clean exit: pcache_evict_memory, then the disk tier's index
 * written, and pcache_destroy keeps the files. The count of checkpoints
 * left on disk, or -1 with err (then destroy deletes them). */
int pcache_persist(pcache *c, tern_error *err);

/* The deepest checkpoint whose path is a prefix of prompt[0..n) with fewer
 * than n tokens (the prompt's last token must still be evaluated for its
 * logits); NULL if none. Counts a hit on it (its priority and its bases'
 * are refreshed). */
pc_node *pcache_lookup(pcache *c, const int32_t *prompt, int n);

/* The deepest checkpoint whose path is a prefix of tokens[0..n), n
 * included: the base a checkpoint at n would be taken after, or the
 * checkpoint at n itself (then *exact is 1). NULL if none. */
pc_node *pcache_base(pcache *c, const int32_t *tokens, int n, int *exact);

/* Adds a checkpoint after tokens[0..n) (n >= 1), taking ownership of snap
 * (freed on every failure, and when a checkpoint is already there). shares:
 * snap was taken after the snapshot of pcache_base's checkpoint, in memory
 * (tern_session_snapshot_after); 0: it is whole. 0, or -1 when out of
 * memory. It does not evict: the caller calls pcache_trim when it can spare
 * the time (moving checkpoints to host memory or disk takes milliseconds
 * that a first token should not wait for). */
int pcache_insert(pcache *c, const int32_t *tokens, int n, tern_snapshot *snap, int shares);

/* Brings a checkpoint on disk (and the bases it needs) back into memory; 0
 * when it is there. -1 when a file failed (err says why): then nd and the
 * checkpoints continuing it are gone, and the caller looks up again. Does
 * not evict: pcache_trim does, once the state was restored. */
int pcache_load(pcache *c, pc_node *nd, tern_error *err);
/* Evicts until each tier is within its budget (the newest checkpoints
 * included). */
void pcache_trim(pcache *c);

/* Empties the device and RAM tiers: each checkpoint in memory is written
 * to the disk tier (within its budget, by the same eviction rule) or
 * dropped. For freeing the model; the tree and the files stay. */
void pcache_evict_memory(pcache *c);
/* The disk tier's files are read for model m from now (a load of the
 * model after pcache_evict_memory); m NULL: for none until the next call.
 * When m's identity differs from the one the files were written for, they
 * are dropped. 0, or -1 with err. */
int pcache_rebind(pcache *c, const tern_model *m, tern_error *err);

/* The checkpoint's snapshot (in device or host memory); NULL while it is
 * on disk. */
const tern_snapshot *pc_node_snapshot(const pc_node *nd);
int pc_node_depth(const pc_node *nd);   /* tokens from the root */
/* A number for the checkpoint, unique over the cache's life (>= 1): who
 * holds it can tell later whether the node it meets is still that one. */
uint64_t pc_node_serial(const pc_node *nd);

typedef struct pcache_stats {
    size_t budget, bytes;                /* the RAM tier's budget; checkpoint bytes held there now */
    int checkpoints;                     /* held in RAM now */
    size_t vram_budget, vram_bytes;      /* the device tier's */
    int vram_checkpoints;
    unsigned long long inserted, evicted;   /* evicted: dropped to stay within a budget */
    unsigned long long vram_moves;       /* moved from device memory to RAM */
    size_t disk_budget, disk_bytes;      /* the disk tier's (0, 0: none) */
    int disk_checkpoints;
    unsigned long long disk_writes, disk_reads, disk_corrupt;   /* spilled; read back; failed verification */
} pcache_stats;
void pcache_stats_get(pcache *c, pcache_stats *out);

/* Checks the tree's invariants (edges, depths, references, bytes); 0 when
 * they hold. For the tests. */
int pcache_check(const pcache *c);

#endif
