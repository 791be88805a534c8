"""`terminus-env serve` with a stub Python (`--python`) that starts the simulated server: real processes, real HTTP.

tests/real_vllm/ runs the same launcher with real vLLM replicas on the CPU."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving_support import pid_alive, terminate, wait_healthy

from terminus_env.serving.client import FRESH_WEIGHT_VERSION
from terminus_env.serving.launcher import WHOLE_PREFILL_NOTE, LaunchError, build_parser, main, plan
from terminus_env.serving.serve_process import free_ports
from terminus_env.serving.weight_sync import BROKEN_TAG

HANG_S = 120.0
"""Every wait below ends on its event (a line, a health answer, a process gone); this bound only stops a hang. A
replica's start is a Python process importing the simulator, which took over 30 s once on a busy host."""

STUB = """#!{python}
# A stand-in for `python -m vllm.entrypoints.openai.api_server --model MODEL --port P ...`: answers the
# launcher's probe for vLLM, records how it was called, then becomes the sim server.
import json, os, sys
args = sys.argv[1:]
if args[0] == "-c":
    sys.exit(0)
port = args[args.index("--port") + 1]
record = {{"pid": os.getpid(), "argv": args, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "dev": os.environ.get("VLLM_SERVER_DEV_MODE")}}
straggler = os.environ.get("STUB_STRAGGLER")  # a file: fork a worker that ignores SIGTERM and keeps writing to it
if straggler and os.fork() == 0:
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(straggler, "a") as out:
        out.write(str(os.getpid()) + "\\n")
        while True:
            out.write("x"); out.flush(); time.sleep(0.001)
with open(os.path.join({records!r}, port + ".json"), "w") as f:
    json.dump(record, f)
sync = ["--weight-sync"] if os.environ.get("VLLM_SERVER_DEV_MODE") == "1" else []
name = args[args.index("--served-model-name" if "--served-model-name" in args else "--model") + 1]
os.execv(sys.executable, [sys.executable, "-m", "terminus_env.serving.sim", "serve", "--port", port,
                          "--model", name, "--time-scale", "0", *sync])
"""


@pytest.fixture
def stub_python(tmp_path):
    """A Python stand-in for `--python`; yields (env, records dir, its path) and kills anything it started."""
    records = tmp_path / "records"
    records.mkdir()
    stub = tmp_path / "python-with-vllm"
    stub.write_text(STUB.format(python=sys.executable, records=str(records)))
    stub.chmod(0o755)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    yield env, records, str(stub)
    for record in records.glob("*.json"):
        terminate(json.loads(record.read_text())["pid"])


@contextlib.contextmanager
def _launched(env, python: str, *args: str) -> Iterator[subprocess.Popen]:
    """`terminus-env serve --python PYTHON ARGS` as a process, killed on the way out whatever the test did."""
    cmd = [sys.executable, "-m", "terminus_env.cli", "serve", "--python", python, *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _read_until_ready(proc: subprocess.Popen, timeout_s: float = HANG_S) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"launcher exited early: rc={proc.wait()} stderr={proc.stderr.read()}")
        lines.append(line.rstrip())
        if line.startswith("evaluate with:"):
            return lines
    raise AssertionError(f"launcher not ready in {timeout_s}s: {lines}")


def _records(records: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]


def _wait_dead(pids: list[int], timeout_s: float = HANG_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(pid_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_serve_starts_replicas_and_ctrl_c_stops_them(stub_python):
    env, records, python = stub_python
    env["CUDA_VISIBLE_DEVICES"] = "4,5,6,7"
    port = free_ports(2)
    args = ["--model", "tiny", "--dp", "2", "--tp", "2", "--port", str(port), "--device", "gpu"]
    with _launched(env, python, *args, "--planned-concurrency", "600", "--", "--gpu-memory-utilization", "0.9") as proc:
        lines = _read_until_ready(proc)
        assert f"  http://127.0.0.1:{port}  (GPUs 4,5, seed 0)" in lines
        assert f"  http://127.0.0.1:{port + 1}  (GPUs 6,7, seed 1)" in lines
        for i in range(2):
            reply = httpx.post(
                f"http://127.0.0.1:{port + i}/v1/chat/completions",
                timeout=10,
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            ).json()
            assert reply["usage"]["completion_tokens"] == 2
        seen = _records(records)
        assert [r["cuda"] for r in seen] == ["4,5", "6,7"] and [r["dev"] for r in seen] == [None, None]
        argv = seen[0]["argv"]
        assert argv[:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "tiny"]
        assert "--enable-prefix-caching" in argv
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
        assert argv[argv.index("--max-num-seqs") + 1] == "300"  # ceil(600/2) > vLLM's default of 256
        assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"  # after temperature, for IS
        # Each replica its own sampling seed: with vLLM's one default, replicas fed alike sample alike.
        assert [r["argv"][r["argv"].index("--seed") + 1] for r in seen] == ["0", "1"]
        assert argv[-2:] == ["--gpu-memory-utilization", "0.9"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=HANG_S) == 0
        assert _wait_dead([r["pid"] for r in seen])


def test_on_the_cpu_each_replica_is_pinned_to_its_own_cores(stub_python):
    env, records, python = stub_python
    port = free_ports(2)
    with _launched(env, python, "--model", "tiny", "--dp", "2", "--port", str(port), "--device", "cpu",
                   "--weight-sync", "--", "--served-model-name", "policy") as proc:  # fmt: skip
        lines = _read_until_ready(proc)
        # The command printed names the model as requests must (the served name), so it runs as printed.
        assert lines[-1] == (f"evaluate with: terminus-env eval --model policy --base-url http://127.0.0.1:{port} "
                             f"--base-url http://127.0.0.1:{port + 1}")  # fmt: skip
        seen = _records(records)
        bound = [r["bind"] for r in seen]
        cores = sorted(os.sched_getaffinity(0))
        share = len(cores) // 2
        halves = [cores[:share], cores[share : 2 * share]]
        assert bound == [str(h[0]) if len(h) == 1 else f"{h[0]}-{h[-1]}" for h in halves]
        assert f"  http://127.0.0.1:{port}  (CPU cores {bound[0]}, seed 0)" in lines
        assert [r["dev"] for r in seen] == ["1", "1"]  # --weight-sync opens vLLM's development endpoints
        assert "--tensor-parallel-size" not in seen[0]["argv"]
        assert "--no-enable-chunked-prefill" in seen[0]["argv"] and WHOLE_PREFILL_NOTE in lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_S) == 0
        assert _wait_dead([r["pid"] for r in seen])


def _stderr_until(proc: subprocess.Popen, text: str, timeout_s: float = HANG_S) -> list[str]:
    """The launcher's stderr lines up to the first that holds ``text``."""
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"launcher's stderr closed (rc={proc.poll()}) before {text!r}: {lines}")
        lines.append(line.rstrip())
        if text in line:
            return lines
    raise AssertionError(f"no {text!r} on the launcher's stderr in {timeout_s}s: {lines}")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_replica_that_dies_is_started_again_while_the_others_keep_serving(stub_python, tmp_path):
    env, records, python = stub_python
    port = free_ports(3)
    logs = tmp_path / "logs"
    args = ["--model", "tiny", "--dp", "3", "--port", str(port), "--log-dir", str(logs), "--device", "gpu",
            "--max-restarts", "1", "--seed", "10"]  # fmt: skip
    with _launched(env, python, *args) as proc:
        _read_until_ready(proc)
        assert f"on http://127.0.0.1:{port + 2}" in (logs / "replica-2.log").read_text()
        seen = _records(records)
        assert len(seen) == 3
        os.kill(seen[1]["pid"], signal.SIGKILL)
        _stderr_until(proc, f"replica 1 (http://127.0.0.1:{port + 1}) exited with code -9 while serving; starting "
                      "it again (1 of 1)")  # fmt: skip
        wait_healthy(f"http://127.0.0.1:{port + 1}", HANG_S)
        again = _records(records)
        assert again[1]["pid"] != seen[1]["pid"]
        seeds = [r["argv"][r["argv"].index("--seed") + 1] for r in again]
        assert seeds == ["10", "13", "12"]  # started again with a seed no start had: it does not replay its draws
        assert [r["pid"] for r in again[::2]] == [r["pid"] for r in seen[::2]]  # the others were never touched
        assert proc.poll() is None
        os.kill(again[1]["pid"], signal.SIGKILL)  # its one restart is spent: it stays down, the others serve on
        _stderr_until(proc, "not restarted again (1 restarts); 2 replica(s) left")
        assert proc.poll() is None and _healthy(f"http://127.0.0.1:{port}") and _healthy(f"http://127.0.0.1:{port + 2}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_S) == 0
        assert _wait_dead([r["pid"] for r in again])


def test_a_replica_tagged_broken_by_a_failed_weight_load_is_started_again_uncounted(stub_python):
    """What ServingPool does with a replica that failed to load weights and could not take the last good ones back:
    tag it on /weight_info and leave it paused. The launcher restarts it, whatever --max-restarts says."""
    env, records, python = stub_python
    port = free_ports(2)
    with _launched(env, python, "--model", "tiny", "--dp", "2", "--port", str(port), "--max-restarts", "0",
                   "--weight-sync") as proc:  # fmt: skip
        _read_until_ready(proc)
        seen = _records(records)
        url = f"http://127.0.0.1:{port + 1}"
        httpx.post(f"{url}/update_weight_version", json={"new_version": BROKEN_TAG}, timeout=10).raise_for_status()
        _stderr_until(proc, f"replica 1 ({url}) failed to load weights and could not take the last good ones back; "
                      "starting it again")  # fmt: skip
        wait_healthy(url, HANG_S)
        again = _records(records)
        assert again[1]["pid"] != seen[1]["pid"] and again[0]["pid"] == seen[0]["pid"] and not pid_alive(seen[1]["pid"])
        assert httpx.get(f"{url}/weight_info", timeout=10).json()["weight_version"] == FRESH_WEIGHT_VERSION
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_S) == 0


def test_with_no_replica_left_the_launcher_exits(stub_python):
    env, records, python = stub_python
    port = free_ports(2)
    with _launched(env, python, "--model", "tiny", "--dp", "2", "--port", str(port), "--max-restarts", "0") as proc:
        _read_until_ready(proc)
        seen = _records(records)
        for record in seen:
            os.kill(record["pid"], signal.SIGKILL)
        assert proc.wait(timeout=HANG_S) == 1
        assert "no replica is left" in proc.stderr.read()


def test_once_the_launcher_has_stopped_no_process_of_a_replica_writes_any_more(stub_python, tmp_path):
    """A worker that ignores SIGTERM and outlives its replica's main process is SIGKILLed, and the launcher returns
    only once it is gone: the caller may remove the replica's folders at once."""
    env, records, python = stub_python
    written = tmp_path / "straggler.out"
    env["STUB_STRAGGLER"] = str(written)
    args = ["--model", "tiny", "--dp", "1", "--port", str(free_ports(1)), "--device", "gpu", "--stop-timeout-s", "1"]
    with _launched(env, python, *args) as proc:
        _read_until_ready(proc)
        deadline = time.monotonic() + HANG_S
        while "\n" not in (written.read_text() if written.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.01)
        worker = int(written.read_text().split("\n", 1)[0])
        try:
            size = written.stat().st_size
            deadline = time.monotonic() + HANG_S
            while written.stat().st_size == size:  # it writes on and on
                assert time.monotonic() < deadline, f"the straggler wrote nothing for {HANG_S:.0f} s"
                time.sleep(0.01)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=HANG_S) == 0
            assert not pid_alive(worker)  # at once, no wait here: gone (or a zombie), it writes nothing more
        finally:
            terminate(worker)


def test_launcher_killed_outright_leaves_no_replica(stub_python):
    env, records, python = stub_python
    with _launched(env, python, "--model", "tiny", "--dp", "2", "--port", str(free_ports(2))) as proc:
        _read_until_ready(proc)
        pids = [r["pid"] for r in _records(records)]
        proc.kill()  # SIGKILL: no cleanup code runs; the replicas' parent-death signal does it
        proc.wait()
        assert _wait_dead(pids)


def test_max_num_seqs_below_the_planned_share_is_refused(stub_python, capsys):
    python = stub_python[2]
    argv = ["--python", python, "--model", "m", "--dp", "4", "--max-num-seqs", "64", "--planned-concurrency", "300"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "ceil(300/4) = 75" in err and "second bottleneck" in err


def test_flags_serve_owns_are_refused_after_the_separator(stub_python, capsys):
    assert main(["--python", stub_python[2], "--model", "m", "--", "--port", "9000"]) == 2
    assert "--port after `--` conflicts" in capsys.readouterr().err
    assert main(["--python", stub_python[2], "--model", "m", "--", "--seed", "3"]) == 2  # one seed for all: copies
    assert "--seed after `--` conflicts" in capsys.readouterr().err


def test_too_few_visible_gpus_is_refused(stub_python, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert main(["--python", stub_python[2], "--model", "m", "--dp", "2", "--tp", "2", "--device", "gpu"]) == 2
    assert "needs 4 GPUs" in capsys.readouterr().err


def test_cpu_replicas_need_a_core_each_and_no_tensor_parallelism():
    def replicas(*args: str, cores=(0, 1)):
        return plan(build_parser().parse_args(["--model", "m", *args]), [], "py", None, gpu_present=False, cores=cores)

    assert [r.env["VLLM_CPU_OMP_THREADS_BIND"] for r in replicas("--dp", "2", cores=range(8))] == ["0-3", "4-7"]
    assert replicas("--cpu-kv-cache-gib", "3")[0].env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert [r.cpus for r in replicas("--dp", "3", cores=(0, 1, 2, 3))] == [(0,), (1,), (2,)]
    with pytest.raises(LaunchError, match="needs a core per replica"):
        replicas("--dp", "3")
    with pytest.raises(LaunchError, match="--tp 2 needs GPUs"):
        replicas("--tp", "2")
    on_gpus = plan(build_parser().parse_args(["--model", "m", "--dp", "2"]), [], "py", None, gpu_present=True)
    assert [r.gpus for r in on_gpus] == [("0",), ("1",)] and on_gpus[0].env == {"CUDA_VISIBLE_DEVICES": "0"}


def test_cpu_replicas_prefill_whole_unless_told_otherwise():
    def argv(*extra: str, gpu: bool = False) -> tuple[str, ...]:
        parsed = build_parser().parse_args(["--model", "m"])
        return plan(parsed, list(extra), "py", None, gpu_present=gpu, cores=(0, 1))[0].argv

    assert "--no-enable-chunked-prefill" in argv()  # a seeded request's split prefill would crash the CPU engine
    assert "--no-enable-chunked-prefill" not in argv(gpu=True)  # CUDA generators rewind; GPUs keep vLLM's default
    chosen = argv("--enable-chunked-prefill", "--max-num-batched-tokens", "256")
    assert chosen.count("--enable-chunked-prefill") == 1 and "--no-enable-chunked-prefill" not in chosen
    assert argv("--no-enable-chunked-prefill").count("--no-enable-chunked-prefill") == 1


def test_without_vllm_the_message_names_the_extra(capsys):
    assert main(["--python", "/bin/false", "--model", "m"]) == 2
    assert "pip install 'terminus-env[vllm]'" in capsys.readouterr().err


def test_logprobs_mode_is_processed_unless_told_otherwise():
    def argv(*args: str) -> tuple[str, ...]:
        return plan(build_parser().parse_args(["--model", "m", *args]), [], "python", "0")[0].argv

    default = argv()
    assert default[default.index("--logprobs-mode") + 1] == "processed_logprobs"
    raw = argv("--logprobs-mode", "raw_logprobs")
    assert raw[raw.index("--logprobs-mode") + 1] == "raw_logprobs"
    assert "--logprobs-mode" not in argv("--logprobs-mode", "engine-default")


def test_logprobs_mode_after_the_separator_is_refused(stub_python, capsys):
    assert main(["--python", stub_python[2], "--model", "m", "--", "--logprobs-mode", "raw_logprobs"]) == 2
    assert "--logprobs-mode after `--` conflicts" in capsys.readouterr().err
