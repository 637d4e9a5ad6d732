"""`tern pull` against a local mock of the Hugging Face hub (mock_hub.py).

The repository served is the two-shard `qwen35` fixture with tern-tiny's tokenizer and chat template, plus files a
pull must leave alone (an extra safetensors file, a vision processor config, a README). Every pulled and packed model
must be byte for byte the `tern pack` of the same files on disk; a pull that was cut off (a dropped connection, a
killed process) must resume with a Range request and end the same.
"""
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from mock_hub import Hub, Repo, wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TERN_BIN = os.environ.get("TERN_BIN", "build/tern")
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "tern-test/qwen35"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
# what the pull fetches (and tern pack reads) ...
WANTED = ["config.json", "generation_config.json", SHARD1, SHARD2, "model.safetensors.index.json",
          "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
# ... and what it must not
UNWANTED = {"reference.safetensors": (FIXTURES / "qwen35" / "reference.safetensors").read_bytes(),
            "preprocessor_config.json": b'{"image_processor_type": "Qwen2VLImageProcessor"}\n',
            "README.md": b"# a model card\n"}
SKIP_COMPARE = {"verified-install.json", "tern-pull.json"}


def tern_bin():
    p = Path(TERN_BIN)
    return str(p if p.is_absolute() else ROOT / p)


def run_tern(*args, hub=None, token=None, endpoint=None, check_rc=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    env["HF_ENDPOINT"] = endpoint or (hub.url if hub else "")
    if token is not None:
        env["HF_TOKEN"] = token
    p = subprocess.run([tern_bin(), *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    for m in SANITIZER_MARKERS:
        assert m not in p.stderr, p.stderr
    if check_rc is not None:
        assert p.returncode == check_rc, p.stderr
    return p


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def manifest_sans_source_path(path):
    m = json.loads(Path(path).read_text())
    del m["source"]["path"]
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()


def tree(d, strict):
    """Every file's SHA-256; unless strict, the manifest's is taken without source.path (the absolute path of the
    folder that was packed, which differs between a pull's download and a local folder)."""
    d = Path(d)
    return {p.relative_to(d).as_posix(): sha256(p) if strict or p.name != "manifest.json"
            else manifest_sans_source_path(p) for p in sorted(d.rglob("*"))
            if p.is_file() and p.name not in SKIP_COMPARE}


def assert_same_model(a, b, strict=False):
    ta, tb = tree(a, strict), tree(b, strict)
    assert "manifest.json" in ta and ta == tb


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The files a pull fetches, as a local Hugging Face folder."""
    d = tmp_path_factory.mktemp("source")
    for name in WANTED:
        src = FIXTURES / "qwen35" / name
        shutil.copy(src if src.exists() else ROOT / "models" / "tern-tiny" / name, d / name)
    return d


@pytest.fixture(scope="module")
def local_pack(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "packed"
    run_tern("pack", "-q", source, out, check_rc=0)
    return out


@pytest.fixture
def hub(source):
    h = Hub()
    repo = h.add(REPO_ID, Repo.from_dir(source, COMMIT))
    repo.files.update(UNWANTED)
    yield h
    h.stop()


def receipt(d):
    return json.loads((Path(d) / "tern-pull.json").read_text())


# ---- the result ------------------------------------------------------------------------------------------------


def test_pull_equals_local_pack_and_runs(hub, tmp_path, source, local_pack):
    out = tmp_path / "model"
    p = run_tern("pull", REPO_ID, out, hub=hub, check_rc=0)
    assert_same_model(out, local_pack)
    assert not (tmp_path / "model.hf").exists()          # the download is removed once packed
    # byte for byte, manifest included, with the local files packed from where the download was
    shutil.copytree(source, tmp_path / "model.hf")
    run_tern("pack", "-q", tmp_path / "model.hf", tmp_path / "local", check_rc=0)
    assert_same_model(out, tmp_path / "local", strict=True)
    r = receipt(out)
    assert r["repo"] == REPO_ID and r["revision"] == "main" and r["commit"] == COMMIT
    assert sorted(r["files"]) == sorted(WANTED)
    for name, f in r["files"].items():
        assert f["sha256"] == sha256(source / name) and f["size"] == (source / name).stat().st_size
    fetched = {path.split("/resolve/", 1)[1] for _, path, _, _ in hub.requests(prefix="/" + REPO_ID + "/resolve/")}
    assert fetched == {COMMIT + "/" + n for n in WANTED}  # pinned to the commit; nothing else fetched
    assert COMMIT in p.stderr
    run = run_tern("run", "-m", out, "-n", "4", "--tokens", "1 2 3", "--seed", "1", check_rc=0)
    assert run.stdout.strip()


def test_no_pack_keeps_the_folder_and_a_second_pull_fetches_nothing(hub, tmp_path, source):
    out = tmp_path / "hf"
    run_tern("pull", REPO_ID + "@" + COMMIT, out, "--no-pack", "-q", hub=hub, check_rc=0)
    assert sorted(p.name for p in out.iterdir()) == sorted(WANTED + ["tern-pull.json"])
    for name in WANTED:
        assert (out / name).read_bytes() == (source / name).read_bytes()
    assert receipt(out)["revision"] == COMMIT
    run_tern("run", "-m", out, "-n", "2", "--tokens", "1 2 3", "--seed", "1", check_rc=0)
    before = len(hub.requests("GET"))
    run_tern("pull", REPO_ID, out, "--no-pack", "-q", hub=hub, check_rc=0)
    gets = hub.requests("GET")[before:]
    assert [g[1] for g in gets] == ["/api/models/%s/revision/main" % REPO_ID]   # files rehashed, not fetched


def test_keep_download(hub, tmp_path, local_pack):
    out = tmp_path / "model"
    run_tern("pull", REPO_ID, out, "--keep-download", "-q", hub=hub, check_rc=0)
    assert_same_model(out, local_pack)
    assert receipt(tmp_path / "model.hf")["commit"] == COMMIT


@pytest.mark.parametrize("fixture", ["mlx-tiny", "fp8-small"])
def test_mlx_and_fp8_repositories(fixture, tmp_path):
    h = Hub()
    try:
        h.add("tern-test/" + fixture, Repo.from_dir(FIXTURES / fixture, COMMIT))
        local = tmp_path / "local"
        run_tern("pack", "-q", FIXTURES / fixture, local, check_rc=0)
        run_tern("pull", "tern-test/" + fixture, tmp_path / "pulled", "-q", hub=h, check_rc=0)
        assert_same_model(tmp_path / "pulled", local)
    finally:
        h.stop()


def test_pack_options_reach_the_pack(hub, tmp_path, source):
    local = tmp_path / "local8"
    run_tern("pack", "-q", "--bits", "8", source, local, check_rc=0)
    run_tern("pull", REPO_ID, tmp_path / "pulled8", "--bits", "8", "-q", hub=hub, check_rc=0)
    assert_same_model(tmp_path / "pulled8", local)


# ---- interruptions ---------------------------------------------------------------------------------------------


def range_starts(hub, name, source):
    sha = sha256(source / name)
    return [int(r.split("=")[1].split("-")[0]) for _, _, r, _ in hub.requests("GET", "/cdn/" + sha) if r]


def test_dropped_connection_is_resumed(hub, tmp_path, source, local_pack):
    hub.drop.add(SHARD1)
    out = tmp_path / "model"
    run_tern("pull", REPO_ID, out, "-q", hub=hub, check_rc=0)
    assert range_starts(hub, SHARD1, source) == [(source / SHARD1).stat().st_size // 2]
    assert_same_model(out, local_pack)


def test_busy_hub_is_retried_after_its_retry_after(hub, tmp_path, source):
    hub.busy = 2
    p = run_tern("pull", REPO_ID, tmp_path / "hf", "--no-pack", hub=hub, check_rc=0)
    assert p.stderr.count("HTTP 503; retrying in 1 s") == 2, p.stderr
    assert (tmp_path / "hf" / SHARD1).read_bytes() == (source / SHARD1).read_bytes()


def test_server_ignoring_range_restarts_the_file(hub, tmp_path, local_pack):
    hub.drop.add(SHARD2)
    hub.norange.add(SHARD2)
    out = tmp_path / "model"
    run_tern("pull", REPO_ID, out, "-q", hub=hub, check_rc=0)
    assert_same_model(out, local_pack)


def test_killed_pull_resumes_from_the_partial_file(hub, tmp_path, source, local_pack):
    hub.stall.add(SHARD1)
    out = tmp_path / "model"
    part = tmp_path / "model.hf" / (SHARD1 + ".incomplete")
    half = (source / SHARD1).stat().st_size // 2
    env = dict(os.environ, HF_ENDPOINT=hub.url)
    env.pop("HF_TOKEN", None)
    proc = subprocess.Popen([tern_bin(), "pull", REPO_ID, str(out), "-q"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: part.exists() and part.stat().st_size == half, timeout=120)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        hub.release.set()
    assert part.stat().st_size == half and not out.exists()
    run_tern("pull", REPO_ID, out, "-q", hub=hub, check_rc=0)
    assert range_starts(hub, SHARD1, source) == [half]
    assert not part.exists()
    assert_same_model(out, local_pack)
    # the same as a pull that was never interrupted
    run_tern("pull", REPO_ID, tmp_path / "uninterrupted", "-q", hub=hub, check_rc=0)
    assert_same_model(out, tmp_path / "uninterrupted")


# ---- refusals --------------------------------------------------------------------------------------------------


def one_line_error(p, *fragments):
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("tern pull: "), p.stderr
    for f in fragments:
        assert f in last, p.stderr


def test_corrupt_file_is_detected_and_deleted(hub, tmp_path):
    hub.corrupt.add(SHARD2)
    out = tmp_path / "model"
    p = run_tern("pull", REPO_ID, out, "-q", hub=hub)
    one_line_error(p, SHARD2, "SHA-256 mismatch")
    assert p.returncode == 1
    assert not (tmp_path / "model.hf" / SHARD2).exists()
    assert not (tmp_path / "model.hf" / (SHARD2 + ".incomplete")).exists()
    assert not out.exists()


def test_unknown_repository(hub, tmp_path):
    p = run_tern("pull", "nobody/nothing", tmp_path / "m", hub=hub)
    one_line_error(p, "nobody/nothing", "repository not found")


def test_unknown_revision(hub, tmp_path):
    p = run_tern("pull", REPO_ID + "@v9", tmp_path / "m", hub=hub)
    one_line_error(p, "revision not found")


def test_private_repository_needs_hf_token(hub, tmp_path, local_pack):
    hub.repos[REPO_ID].token = "secret"
    one_line_error(run_tern("pull", REPO_ID, tmp_path / "a", hub=hub), "set HF_TOKEN")
    one_line_error(run_tern("pull", REPO_ID, tmp_path / "b", hub=hub, token="wrong"), "access denied", "HF_TOKEN")
    run_tern("pull", REPO_ID, tmp_path / "c", "-q", hub=hub, token="secret", check_rc=0)
    assert_same_model(tmp_path / "c", local_pack)
    api = hub.requests("GET", "/api/models/")
    assert api[-1][3] == "Bearer secret" and api[0][3] is None
    storage = hub.requests("GET", "/cdn/")
    assert storage and all(auth is None for *_, auth in storage)   # the token stays with the hub


@pytest.mark.parametrize("name", ["../evil.json", "sub/../../evil.json", "/tmp/evil.json", "dir\\evil.json",
                                  "a//b.json", "./config.json"])
def test_unsafe_name_in_listing_is_refused(hub, tmp_path, name):
    hub.repos[REPO_ID].extra_names.append(name)
    out = tmp_path / "sub" / "model"
    out.parent.mkdir()
    p = run_tern("pull", REPO_ID, out, hub=hub)
    one_line_error(p, "unsafe file name")
    assert not hub.requests(prefix="/" + REPO_ID + "/resolve/")
    assert [p.name for p in tmp_path.rglob("*")] == ["sub"]


def test_unsafe_shard_in_index_is_refused(hub, tmp_path):
    repo = hub.repos[REPO_ID]
    index = json.loads(repo.files["model.safetensors.index.json"])
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../evil.safetensors"
    repo.files["model.safetensors.index.json"] = json.dumps(index).encode()
    p = run_tern("pull", REPO_ID, tmp_path / "m", hub=hub)
    one_line_error(p, "unsafe or odd file name", "../evil.safetensors")
    assert not hub.requests("GET", "/cdn/")


@pytest.mark.parametrize("shards,size,args", [((SHARD2,), 1 << 60, ()),
                                              ((SHARD1, SHARD2), (1 << 63) - 1, ("--no-pack",))])
def test_not_enough_space_stops_before_downloading(hub, tmp_path, shards, size, args):
    hub.huge.update(shards)
    hub.huge_size = size   # two such sizes and the other files add up past 2^64
    p = run_tern("pull", REPO_ID, tmp_path / "m", *args, hub=hub)
    one_line_error(p, "not enough disk space")
    assert not hub.requests("GET", "/cdn/")


@pytest.mark.parametrize("name", [SHARD1, "config.json"])
def test_file_without_hash_is_refused(hub, tmp_path, name):
    hub.nohash.add(name)
    p = run_tern("pull", REPO_ID, tmp_path / "m", "--no-pack", hub=hub)
    one_line_error(p, name, "no SHA-256" if name == SHARD1 else "no hash")
    assert not hub.requests("GET", "/cdn/")


def test_impossible_size_is_refused(hub, tmp_path):
    hub.huge.add(SHARD1)
    hub.huge_size = 1 << 63
    p = run_tern("pull", REPO_ID, tmp_path / "m", hub=hub)
    one_line_error(p, SHARD1, "impossible size")
    assert not hub.requests("GET", "/cdn/")


@pytest.mark.parametrize("zeros, whole", [(80, True), (120, False)])
def test_size_with_leading_zeros(hub, tmp_path, source, zeros, whole):
    """A size is its digits, leading zeros and all; one too long to read whole is no size."""
    hub.huge.add(SHARD1)
    hub.huge_size = "0" * zeros + str((source / SHARD1).stat().st_size)
    p = run_tern("pull", REPO_ID, tmp_path / "m", "--no-pack", hub=hub)
    if whole:
        assert p.returncode == 0, p.stderr
        assert sha256(tmp_path / "m" / SHARD1) == sha256(source / SHARD1)
    else:
        one_line_error(p, SHARD1, "X-Linked-Size")


def test_network_failure_after_retries(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    p = run_tern("pull", REPO_ID, tmp_path / "m", "--retries", "1", endpoint="http://127.0.0.1:%d" % port)
    one_line_error(p, "network failure after 2 attempts")


def test_bad_pack_option_fails_before_downloading(hub, tmp_path):
    p = run_tern("pull", REPO_ID, tmp_path / "m", "--bits", "5", hub=hub, check_rc=2)
    assert "--bits must be 4 or 8" in p.stderr
    assert not hub.requests()


def test_one_pull_at_a_time(hub, tmp_path):
    (tmp_path / "m.hf").mkdir()
    with open(tmp_path / "m.hf" / ".tern-pull.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        p = run_tern("pull", REPO_ID, tmp_path / "m", hub=hub)
    one_line_error(p, "another tern pull is using it")
    assert not hub.requests("GET", "/cdn/")


def test_existing_destination_is_refused(hub, tmp_path):
    (tmp_path / "m").mkdir()
    p = run_tern("pull", REPO_ID, tmp_path / "m", hub=hub)
    one_line_error(p, "already exists")
    assert not hub.requests()
