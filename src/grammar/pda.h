/* The pushdown automaton that runs a finished grammar over bytes.
 *
 * A stack is a chain of frames; a frame is (position, parent frame), and
 * frames are hash-consed, so a stack is named by the id of its top frame
 * and two equal stacks have the same id. The top frame's position is the
 * byte class to read next; a lower frame's position is where its rule
 * continues once the frame above it ends. A state is a set of top frames
 * (sorted ids) plus flags: COMPLETE when the grammar may end here.
 *
 * A frame's closure (the top frames reached from it without reading a
 * byte: references expanded, finished alternatives popped) is computed
 * once and kept. A reference that ends its alternative is a tail call: the
 * new frame takes the caller's parent, so repetitions (right recursion)
 * leave the stack as deep as it was.
 *
 * The parent SENTINEL stands for an unknown rest of the stack: the mask
 * tables (tables.c) run a position alone over it, and POPPED says that
 * the position's rule may have ended, handing the rest of the input to
 * whatever lies below. */
#ifndef TERN_GRAMMAR_PDA_H
#define TERN_GRAMMAR_PDA_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

#define PDA_ROOT 0xFFFFFFFFu      /* below the root rule's frame: ending there completes the grammar */
#define PDA_SENTINEL 0xFFFFFFFEu  /* below a position run alone */
#define PDA_UNSET 0xFFFFFFFDu

enum { PDA_COMPLETE = 1, PDA_POPPED = 2 };

typedef struct pda_frame {
    uint32_t pos, parent;
    uint32_t next;               /* frame (pos + 1, parent), or PDA_UNSET */
    uint32_t clo;                /* its closure's offset in the pool, PDA_UNSET, or PDA_BUSY */
    uint32_t dmin;               /* fewest tokens (or bytes) that finish this frame and those below it */
    uint32_t depth;              /* frames in its stack */
} pda_frame;

/* Stacks deeper than this are refused (the closure recursion follows
 * them; nested JSON takes a few frames a level). */
#define PDA_MAX_DEPTH 4096

typedef struct pda {
    const gr_grammar *g;
    pda_frame *f;
    uint32_t n, cap, max_frames;
    uint32_t *ht;                /* frame ids by (pos, parent); 0xFFFFFFFF = empty */
    uint32_t ht_cap;
    uint32_t *pool;              /* closures: flags, count, sorted ids */
    size_t pool_n, pool_cap;
    uint32_t *scratch;
    size_t sn, scap;
    int oom;
} pda;

typedef struct pda_state {
    uint32_t flags;
    uint32_t n, cap;
    uint32_t *ids;
} pda_state;

int pda_init(pda *p, const gr_grammar *g, uint32_t max_frames);
void pda_free(pda *p);
/* The frame (pos, parent), made when new; PDA_UNSET when out of room. */
uint32_t pda_frame_get(pda *p, uint32_t pos, uint32_t parent);
/* The closure of frame f: an offset into p->pool (flags, count, ids), or
 * PDA_UNSET when out of room. */
uint32_t pda_closure(pda *p, uint32_t f);

void pda_state_free(pda_state *s);
int pda_state_copy(pda_state *dst, const pda_state *src);
/* The grammar's start: the root rule's alternatives over PDA_ROOT. */
int pda_start(pda *p, pda_state *out);
/* out = the state after reading byte b in ids[0..n). 0, or -1 when out of
 * room (p->oom). out may not alias ids. */
int pda_advance(pda *p, const uint32_t *ids, uint32_t n, unsigned b, pda_state *out);
/* Fewest bytes that finish the grammar from the state (0 when complete). */
uint32_t pda_state_min(const pda *p, const pda_state *s);
/* A state that can still read a byte or end. */
static inline int pda_alive(const pda_state *s) { return s->n > 0 || (s->flags & (PDA_COMPLETE | PDA_POPPED)); }

#endif
