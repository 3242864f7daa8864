"""Every process a `unirl` command starts dies with it (flows/supervise.py): Prefect's temporary API server of
`unirl ingest` after a SIGKILL; Prefect's temporary server and the local Ray of `unirl train` (whose every listening
socket is on 127.0.0.1 and whose session folders are in the workspace) after a Ctrl-C on its terminal, which also
stops the command within seconds with exit code 130 (flows/interrupt.py)."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow
UNIRL = str(Path(sys.executable).parent / "unirl")
GONE_WITHIN_S = 10  # the supervisor's SIGTERM grace is 3 s; the rest is margin for a loaded machine


def tree(pid: int) -> list[psutil.Process]:
    top = psutil.Process(pid)
    return [top, *top.children(recursive=True)]


def command_lines(processes: list[psutil.Process]) -> list[str]:
    lines = []
    for process in processes:
        try:
            lines.append(" ".join(process.cmdline()))
        except psutil.Error:  # exited meanwhile
            continue
    return lines


def wait_for_descendants(process: subprocess.Popen, wanted, timeout_s: float) -> list[psutil.Process]:
    """The command's process tree once `wanted(command lines)` holds, the command still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, f"the command exited ({process.returncode}) before it could be killed"
        assert time.monotonic() < deadline, "what the test waits for never started"
        processes = tree(process.pid)
        if wanted(command_lines(processes)):
            return processes
        time.sleep(0.05)


def identities(processes: list[psutil.Process]) -> set[tuple[int, float, str]]:
    """(pid, start time, whole command line): a checkout's path can be long, so the line is never cut here."""
    return {(p.pid, p.create_time(), " ".join(p.cmdline())) for p in processes if p.is_running()}


def still_running(started: set[tuple[int, float, str]]) -> list[str]:
    running = []
    for pid, created, line in started:
        try:
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                running.append(f"{pid} {line[-100:]}")
        except psutil.NoSuchProcess:
            continue
    return running


def sigkill_and_wait_until_gone(process: subprocess.Popen, started: set) -> float:
    """SIGKILL the command (only the process it is); seconds until every process it started is gone."""
    killed = time.monotonic()
    process.send_signal(signal.SIGKILL)
    process.wait()
    while still_running(started) and time.monotonic() - killed < GONE_WITHIN_S:
        time.sleep(0.05)
    assert not still_running(started), f"still running {GONE_WITHIN_S} s after SIGKILL: {still_running(started)}"
    return time.monotonic() - killed


def on_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # ::ffff:127.0.0.1 is loopback too


def test_sigkill_of_unirl_ingest_stops_its_temporary_prefect_server(tmp_path):
    (tmp_path / "rows.parquet").write_bytes(b"not a parquet file")  # there, so the flow starts (and later fails)
    recipe = tmp_path / "ingest.yaml"
    recipe.write_text(json.dumps({"ingest": {"dataset_output_root": str(tmp_path / "out"),
                                             "download_parquet": {"parquet_pattern": str(tmp_path / "*.parquet")}}}))  # fmt: skip
    env = {**os.environ, "UNIRL_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)  # Prefect starts its temporary server (uvicorn) under the command
    process = subprocess.Popen([UNIRL, "ingest", str(recipe)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    started = set()
    try:
        processes = wait_for_descendants(process, lambda lines: any("uvicorn" in line for line in lines), 120)
        started = identities(processes)
        assert any("uvicorn" in line for _, _, line in started)
    finally:
        seconds = sigkill_and_wait_until_gone(process, started)
    print(f"all gone {seconds:.2f} s after SIGKILL")


def _worker_group_built(lines: list[str]) -> bool:
    """A worker runs a method that comes after its group's set-up (its rendezvous store and process group open)."""
    methods = {line.split()[0].partition(".")[2] for line in lines if line.startswith("ray::TrainWorker.")}
    return bool(methods - {"rendezvous_address", "setup", "__ray_call__"})


# A new session whose controlling terminal is stdin (the pty), then the command in this same process, as a login
# shell starts it: the terminal's Ctrl-C then goes to the command's process group. (No preexec_fn: the test process
# has threads.)
CONTROLLING_TERMINAL = "import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.argv[1], sys.argv[1:])"


def test_ctrl_c_on_its_terminal_stops_unirl_train_within_10_s_keeping_its_last_commit(tmp_path):
    """`unirl train demo` (a local Ray with its training worker, Prefect's temporary server) on a pty that is its
    controlling terminal. While it trains, every listening socket of the command's processes is on 127.0.0.1 and
    Ray's session folder is in the workspace. Ctrl-C typed there once a step is committed (the kernel sends SIGINT to
    the whole foreground process group, Ray's and Prefect's processes included, as a terminal does): within 10 s
    every process of the command (gcs_server, raylet, agents, the worker, uvicorn) is gone, the exit code is 130, one
    line says which checkpoint is kept and which command goes on from it, and that checkpoint is whole (every file
    its record lists, with its size and CRC-32). flows/interrupt.py; after a SIGKILL the supervisor stops the same
    processes (flows/supervise.py; the SIGKILL of `unirl ingest` above)."""
    import pty
    import re
    import threading

    from unirl_core.worker.checkpoint import CheckpointManager

    home = tempfile.mkdtemp(prefix="unirl-", dir="/tmp")  # short: Ray's sockets go under it
    out = tmp_path / "out"
    env = {**os.environ, "UNIRL_HOME": home, "PREFECT_HOME": str(tmp_path / "prefect"), "COLUMNS": "100"}
    for name in ("PREFECT_API_URL", "RAY_ADDRESS"):
        env.pop(name, None)  # a first-time user's run: Prefect's temporary server, a local Ray
    command = [UNIRL, "train", "demo", "--steps", "50", "--checkpoint-every", "1", "--set", f"train.output_dir={out}",
               "--set", "train.ray.workers=1"]  # fmt: skip
    primary, secondary = pty.openpty()
    process = subprocess.Popen([sys.executable, "-c", CONTROLLING_TERMINAL, *command], stdin=secondary, stdout=secondary,
                               stderr=secondary, env=env)  # fmt: skip
    os.close(secondary)
    output = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: every holder of the terminal has exited
                return
            if not chunk:
                return
            output.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    started = set()
    try:
        committed = out / "checkpoints" / "step_00000000" / "trainer_state.json"
        deadline = time.monotonic() + 300
        while not committed.is_file():
            assert process.poll() is None and time.monotonic() < deadline, output.decode(errors="replace")[-3000:]
            time.sleep(0.05)
        processes = wait_for_descendants(process, _worker_group_built, 60)
        started = identities(processes)
        names = " ".join(line for _, _, line in started)
        assert "gcs_server" in names and "raylet" in names and "uvicorn" in names
        pids = {pid for pid, _, _ in started}
        listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]
        assert listening and not [c for c in listening if not on_loopback(c.laddr.ip)], [
            (c.laddr, psutil.Process(c.pid).cmdline()[:1]) for c in listening if not on_loopback(c.laddr.ip)
        ]
        assert list((Path(home) / "ray").glob("session_*/logs")), "Ray's session folder is not in the workspace"
        typed = time.monotonic()
        os.write(primary, b"\x03")  # Ctrl-C
        code = process.wait(timeout=60)
        while still_running(started) and time.monotonic() - typed < GONE_WITHIN_S:
            time.sleep(0.05)
        seconds = time.monotonic() - typed
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        reader.join(timeout=10)
        os.close(primary)
        shutil.rmtree(home, ignore_errors=True)
    text = output.decode(errors="replace").replace("\r", "")
    assert code == 130, text[-3000:]
    assert not still_running(started), f"still running {seconds:.1f} s after Ctrl-C: {still_running(started)}"
    assert seconds < GONE_WITHIN_S
    lines = [line for line in text.splitlines() if line.startswith("interrupted:")]
    assert len(lines) == 1, text[-3000:]
    kept = re.fullmatch(
        r"interrupted: kept checkpoint (step_\d{8}) \((.+)\); rerun `(.+)` to go on from there", lines[0]
    )
    assert kept and kept.group(3) == " ".join(["unirl", *command[1:]]), lines[0]
    CheckpointManager.verify(out / "checkpoints" / kept.group(1))  # whole: nothing half-written
    assert "Traceback" not in text and "Error logging to API" not in text
    print(f"exit {code} and all gone {seconds:.2f} s after Ctrl-C; {lines[0]}")
