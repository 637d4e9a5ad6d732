"""The prefix cache's disk tier (docs/SERVER.md, "Conversations that continue"): checkpoints that --cache-ram evicts
are written to --cache-disk and read back, verified, when a prompt resumes from them. As in test_prefix_cache.py,
the server runs one slot and an unrelated request comes between the turns, so a reused prefix can only come from
the cache; a warm answer must equal a fresh server's (greedy)."""
import os
import stat
import subprocess
import time

import pytest

from helpers import REPO, Server, tern_bin
from test_prefix_cache import EXODUS, GENESIS, cached, cold_complete, complete, something_else, tokenize

INTERVAL = 64
COMMON = ["--ctx", "4096", "--slots", "1", "--cache-checkpoint-interval", str(INTERVAL)]
DISK_SIZE = 64 << 20
CUT = 192


@pytest.fixture(scope="module")
def cold():
    s = Server(COMMON + ["--cache-ram", "0"])
    yield s
    s.assert_clean_stop()


@pytest.fixture
def disk_server(start_server, tmp_path):
    """A RAM tier that holds one or two checkpoints of tern-tiny, so the rest spill to the disk tier."""
    d = tmp_path / "cache"
    s = start_server(*COMMON, "--cache-ram", "2M", "--cache-disk", str(d), "--cache-disk-size", str(DISK_SIZE))
    return s, d


def idle(s):
    """Waits until the scheduler is done with the last request: its checkpoint after the answer is taken once the
    answer went out."""
    deadline = time.monotonic() + 30
    while s.metric("tern_requests_generating") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def disk(s, name):
    idle(s)
    return s.metric(f"tern_prefix_cache_disk_{name}")


def files(d):
    return sorted(p for p in d.iterdir())


def turn_then_resume(s, cold):
    """A long prompt (checkpoints every 64 tokens; the small RAM tier keeps the chain's first ones, the bases of
    the others, and spills its leaves), something else, then a prompt that diverges after 192 tokens: it resumes
    from the checkpoint at 192, which is on disk."""
    a = tokenize(GENESIS)
    complete(s, a)
    something_else(s)
    b = a[:CUT] + tokenize(EXODUS)
    warm = complete(s, b, max_tokens=24)
    assert warm["choices"][0]["text"] == cold_complete(cold, b, max_tokens=24)["choices"][0]["text"]
    return warm


def test_a_continuation_restored_from_disk_is_exact(disk_server, cold):
    s, d = disk_server
    assert disk(s, "budget_bytes") == DISK_SIZE
    warm = turn_then_resume(s, cold)
    assert disk(s, "writes_total") > 0
    assert disk(s, "reads_total") > 0, "the checkpoint at 192 came back from disk"
    assert cached(warm) == CUT
    assert disk(s, "corrupt_total") == 0


def test_files_and_directory_are_private(disk_server, cold):
    s, d = disk_server
    turn_then_resume(s, cold)
    idle(s)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    fs = files(d)
    assert fs and disk(s, "checkpoints") == len(fs)
    for f in fs:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        assert f.name.endswith(".snap") and len(f.name.split("-")[0]) == 64, f.name
    assert sum(f.stat().st_size for f in fs) == disk(s, "bytes")


def flip_a_byte(f):
    """One byte flipped in the middle of the file's bytes."""
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [flip_a_byte, lambda f: f.unlink()], ids=["flipped byte", "missing"])
def test_a_damaged_file_is_dropped_and_the_answer_stays_exact(disk_server, cold, damage):
    s, d = disk_server
    a = tokenize(GENESIS)
    complete(s, a)
    something_else(s)
    idle(s)
    fs = files(d)
    assert fs, "checkpoints spilled"
    for f in fs:
        damage(f)
    b = a[:CUT] + tokenize(EXODUS)
    warm = complete(s, b, max_tokens=24)
    assert warm["choices"][0]["text"] == cold_complete(cold, b, max_tokens=24)["choices"][0]["text"]
    assert disk(s, "corrupt_total") > 0
    assert cached(warm) < CUT
    # every file left is in the tree; a checkpoint whose file went missing is only noticed when it is read
    assert disk(s, "checkpoints") >= len(files(d))


def test_bytes_on_disk_stay_within_the_budget(start_server, tmp_path):
    d = tmp_path / "small"
    s = start_server("--cache-ram", "2M", "--cache-checkpoint-interval", "16", "--cache-disk", str(d),
                     "--cache-disk-size", "4M")
    words = GENESIS.split()
    peak = 0
    for i in range(8):
        complete(s, " ".join(words[i * 10:i * 10 + 40]), max_tokens=2)
        on_disk = disk(s, "bytes")
        assert on_disk <= 4 << 20
        assert sum(f.stat().st_size for f in files(d)) == on_disk
        peak = max(peak, on_disk)
    assert peak > 2 << 20, "the disk tier filled up"
    assert disk(s, "writes_total") > 0 and s.metric("tern_prefix_cache_evictions_total") > 0


def kill(s):
    """A crash: no clean exit, so no index is written."""
    s.proc.kill()
    s.proc.wait()
    s.stopped = True
    os.unlink(s.log.name)


def test_the_disk_tier_survives_a_clean_restart(start_server, tmp_path, cold):
    """A clean stop writes the tier's index beside its files and the next server adopts them: a prompt resumes
    from a checkpoint the first server took, exactly. A killed server leaves no index, so the next start deletes
    its files; another model's files are left alone."""
    d = tmp_path / "restart"
    other = d / ("0" * 64 + "-0000000000000000-1.snap")
    s = start_server(*COMMON, "--cache-ram", "2M", "--cache-disk", str(d))
    other.write_bytes(b"not ours")
    a = tokenize(GENESIS)
    complete(s, a)
    idle(s)
    assert not s.stop()
    kept = [f for f in files(d) if f != other]
    assert any(f.name.endswith("-index") for f in kept) and len(kept) > 2, kept
    s = start_server(*COMMON, "--cache-ram", "2M", "--cache-disk", str(d))
    assert disk(s, "checkpoints") == len(kept) - 1, "the checkpoints of the last run were not adopted"
    assert "checkpoints kept in" in s.stderr()
    b = a[:CUT] + tokenize(EXODUS)
    warm = complete(s, b, max_tokens=24)
    assert cached(warm) == CUT, "the prompt did not resume from the last run's checkpoint"
    assert warm["choices"][0]["text"] == cold_complete(cold, b, max_tokens=24)["choices"][0]["text"]
    assert disk(s, "reads_total") > 0
    kill(s)
    assert len(files(d)) > 2
    s = start_server(*COMMON, "--cache-ram", "2M", "--cache-disk", str(d))
    assert files(d) == [other] and disk(s, "checkpoints") == 0


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_index_starts_empty(start_server, tmp_path, damage):
    d = tmp_path / "damaged"
    s = start_server(*COMMON, "--cache-ram", "2M", "--cache-disk", str(d))
    a = tokenize(GENESIS)
    complete(s, a)
    idle(s)
    assert not s.stop()
    index = next(f for f in files(d) if f.name.endswith("-index"))
    data = bytearray(index.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 1
    else:
        data = data[:len(data) // 2]
    index.write_bytes(bytes(data))
    s = start_server(*COMMON, "--cache-ram", "2M", "--cache-disk", str(d))
    assert disk(s, "checkpoints") == 0 and files(d) == []
    assert "starts empty" in s.stderr()
    assert cached(complete(s, a)) == 0


def test_no_disk_tier_no_disk_metrics(start_server):
    s = start_server("--cache-ram", "2M")
    assert "tern_prefix_cache_disk_bytes" not in s.get("/metrics").body.decode()


@pytest.mark.parametrize("args, flag", [
    (["--cache-disk-size", "lots", "--cache-disk", "/tmp"], "--cache-disk-size"),
    (["--cache-disk-size", "-1G", "--cache-disk", "/tmp"], "--cache-disk-size"),
    (["--cache-disk-size", "8G"], "--cache-disk"),
    (["--cache-disk", "/dev/null"], "--cache-disk"),
    (["--cache-disk", ""], "--cache-disk"),
])
def test_bad_disk_options_refused(args, flag):
    p = subprocess.run([str(tern_bin()), "serve", "--port", "0", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], p.stderr


def test_an_unwritable_directory_is_refused(tmp_path):
    d = tmp_path / "ro"
    d.mkdir(mode=0o500)
    if os.access(d, os.W_OK):
        pytest.skip("running as a user who may write anywhere")
    p = subprocess.run([str(tern_bin()), "serve", "--port", "0", "--cache-disk", str(d)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--cache-disk" in lines[0] and "not writable" in lines[0], p.stderr
