"""unirl ingest vs img2dataset 1.47 vs the bare CPU loop, on the same JPEGs served from a loopback HTTP server.

    .venv/bin/python benchmarks/ingest_vs_img2dataset.py [--images 2000] [--processes 2] [--threads 16] [--timeout 10]
    .venv/bin/python benchmarks/ingest_vs_img2dataset.py --slow-hosts --threads 64 --timeout 5 [--images 20000]
    .venv/bin/python benchmarks/ingest_vs_img2dataset.py --smoke     # 4 images, 1 process (make test's)

- Generates `--images` photo-like JPEGs of mixed sizes (300-1500 px), cached in --work.
- Serves them from a loopback HTTP server in this process (both tools fetch over real HTTP).
- img2dataset 1.47 runs from its own virtualenv (its pins, webdataset<0.3 and pandas<3, conflict with ours); the
  script creates it with pip on first use.
- unirl ingest runs as the `unirl ingest` command against a local Prefect server started here (as `make serve`
  would), so the ephemeral server's start-up is not counted; its own in-flow rate is printed too. Its packages are
  compiled to bytecode first, as pip compiled img2dataset's at install (an editable install compiles on first
  import, except where PYTHONDONTWRITEBYTECODE is set: 0.4 s of every run otherwise).
- The bare loop decodes, resizes (keep_ratio 256, Lanczos) and encodes (quality 95) the same bytes in
  `--processes` processes: the CPU limit of the work itself.
- Peak RSS of `unirl ingest` with 1x, 2x and 4x the rows (the same images under several URLs each): the sum over the
  command's processes (its work units run in up to 2 x `--processes` worker processes), sampled every 0.1 s.

Same settings everywhere: keep_ratio 256, JPEG quality 95, the same process and thread counts, and `--timeout` as
img2dataset's socket timeout and as unirl's connect and read timeouts; no retries.

`--slow-hosts` runs the same images as an open-internet mix instead: one URL in 20 is a slow host (answers after
3 s), one in 20 a dead host (a loopback port that accepts the connection and never answers: both tools give up
at `--timeout`), evenly spread through the input. It prints unirl and img2dataset on that input, unirl on the
fault-free input, and the ratios (goals: unirl >= 1.5x img2dataset, and >= 0.8x its own fault-free rate). Each
slow or dead row holds a thread for 3 s or `--timeout`, so the threads must cover that wait: at 5 s, 0.4
thread-seconds per row on average, hence `--threads 64`. The bare loop and the RSS check are skipped.

`--smoke` (what `make test` runs): 4 images in a temporary --work, 1 process x 4 threads, the bare loop, unirl and
img2dataset where it is already installed (on the PATH or in --work; the smoke installs nothing: otherwise that side
is skipped, saying so), no RSS check. The Prefect server still starts (most of its ~20 s).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import BaseRequestHandler, ThreadingTCPServer

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
UNIRL = str(Path(sys.executable).parent / "unirl")
PREFECT = str(Path(sys.executable).parent / "prefect")
FAULT_EVERY = 20  # --slow-hosts: row i is slow when i % 20 == 10 and dead when i % 20 == 19 (5% each)
SLOW_S = 3.0  # seconds a slow host waits before it answers


def photo_like(width: int, height: int, seed: int) -> bytes:
    """Smooth gradients, blobs and sensor-like noise: compresses like a photo (about 1-3 bits per pixel)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(2, height // 64), max(2, width // 64), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    noise = rng.normal(0, 8, (height, width, 3))
    out = io.BytesIO()
    Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def _make_image(job: tuple[Path, int, int, int]) -> None:
    path, width, height, seed = job
    path.write_bytes(photo_like(width, height, seed))


def make_images(folder: Path, count: int, processes: int) -> list[Path]:
    """Image i has a size drawn i-th from one seeded stream, so a larger --images keeps the smaller set's images."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes = [(int(w), int(h)) for w, h in (rng.integers(300, 1501, 2) for _ in range(count))]
    paths = [folder / f"{i:05d}.jpg" for i in range(count)]
    missing = [(path, w, h, i) for i, (path, (w, h)) in enumerate(zip(paths, sizes, strict=True)) if not path.exists()]
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(_make_image, missing, chunksize=16))
    return paths


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that gave up (timeout) breaks the pipe: expected here


def serve(images: list[Path]) -> tuple[ThreadingHTTPServer, str]:
    """Image i at /<i>-<copy>.jpg, and the same after SLOW_S seconds at /slow/<i>-<copy>.jpg (read per request:
    20,000 images are ~3 GB)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            index = int(self.path.rsplit("/", 1)[-1].split(".")[0].split("-")[0])
            body = images[index].read_bytes()
            if self.path.startswith("/slow/"):
                time.sleep(SLOW_S)
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = QuietServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def serve_dead_host() -> tuple[ThreadingTCPServer, str]:
    """A host that accepts connections, reads the request and never answers, until the client hangs up."""

    class Silent(BaseRequestHandler):
        def handle(self):
            while self.request.recv(65536):
                pass

    server = ThreadingTCPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def url_for(i: int, copy: int, base: str, dead_base: str | None) -> str:
    name = f"{i:05d}-{copy}.jpg"
    if dead_base is not None and i % FAULT_EVERY == FAULT_EVERY - 1:
        return f"{dead_base}/{name}"
    if dead_base is not None and i % FAULT_EVERY == FAULT_EVERY // 2:
        return f"{base}/slow/{name}"
    return f"{base}/{name}"


def write_input(path: Path, base: str, count: int, copies: int = 1, dead_base: str | None = None) -> Path:
    """The input rows; with `dead_base`, one row in FAULT_EVERY is a slow host and one a dead host."""
    rows = [
        {"url": url_for(i, c, base, dead_base), "caption": f"benchmark image {i} copy {c}"}
        for c, i in itertools.product(range(copies), range(count))
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def run_measured(command: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Wall seconds, the peak of the summed RSS in MB of the process and all its descendants (sampled every 0.1 s:
    unirl's work units run in worker processes), and its stdout. It also prints the peak summed PSS: pages shared
    by processes (a forkserver's children share its imported libraries) counted once, sampled every 0.5 s."""
    import psutil

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
        peak, peak_pss, done = [0], [0], threading.Event()

        def sample() -> None:
            for tick in itertools.count():
                if done.wait(0.1):
                    return
                try:
                    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
                    peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
                    if tick % 5 == 0:  # PSS reads every mapping of each process: twice a second is cheap enough
                        peak_pss[0] = max(peak_pss[0], sum(p.memory_full_info().pss for p in tree if p.is_running()))
                except psutil.Error:
                    continue

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        process.wait()
        seconds = time.perf_counter() - start
        done.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            raise RuntimeError(f"{command[0]} failed:\n{err.read()[-3000:]}")
        print(
            f"  peak memory of {Path(command[0]).name}: RSS {peak[0] >> 20} MB, PSS {peak_pss[0] >> 20} MB", flush=True
        )
        return seconds, peak[0] // 2**20, out.read()


def ensure_img2dataset(venv: Path, install: bool = True) -> Path | None:
    """img2dataset's command in `venv`, installed there on first use; with `install` false, an installed one (in
    `venv` or on the PATH) or None."""
    binary = venv / "bin" / "img2dataset"
    if not binary.exists() and not install:
        found = shutil.which("img2dataset")
        return Path(found) if found else None
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "img2dataset==1.47"], check=True)
    return binary


def img2dataset_binary(args) -> Path | None:
    """The img2dataset command, or None (printed) when --skip-img2dataset or --smoke finds none installed."""
    if args.skip_img2dataset:
        return None
    binary = ensure_img2dataset(args.work / "img2dataset-venv", install=not args.smoke)
    if binary is None:
        print("img2dataset 1.47    skipped: the img2dataset package is not installed (--smoke installs nothing; "
              "without --smoke this script installs img2dataset==1.47 in its own virtualenv)", flush=True)  # fmt: skip
    return binary


def run_img2dataset(binary: Path, parquet: Path, out: Path, args) -> tuple[float, dict]:
    shutil.rmtree(out, ignore_errors=True)
    command = [
        str(binary), "--url_list", str(parquet), "--input_format", "parquet", "--url_col", "url",
        "--caption_col", "caption", "--output_format", "webdataset", "--output_folder", str(out),
        "--processes_count", str(args.processes), "--thread_count", str(args.threads),
        "--image_size", "256", "--resize_mode", "keep_ratio", "--encode_quality", "95",
        "--number_sample_per_shard", "1000", "--timeout", str(args.timeout), "--retries", "0",
        "--disallowed_header_directives", "[]", "--enable_wandb", "False",
    ]  # fmt: skip
    seconds, _, _ = run_measured(command)
    stats = [json.loads(p.read_text()) for p in out.glob("*_stats.json")]
    return seconds, {"ok": sum(s["successes"] for s in stats), "rows": sum(s["count"] for s in stats)}


def compile_unirl() -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", "unirl_core", "flows", "tasks"], cwd=ROOT, check=True)


def run_unirl(parquet: Path, out: Path, args, env: dict) -> tuple[float, int, dict]:
    shutil.rmtree(out, ignore_errors=True)
    recipe = out.parent / f"{out.name}.yaml"
    recipe.write_text(
        json.dumps(
            {
                "ingest": {
                    "dataset_output_root": str(out),
                    "download_parquet": {"parquet_pattern": str(parquet), "rows_per_unit": 1000},
                    "download_images": {
                        "allowed_private_networks": ["127.0.0.1/32"],
                        "download_num_processes": args.processes,
                        "download_num_threads": args.threads,
                        "resize_mode": "keep_ratio",
                        "image_size": 256,
                        "encode_quality": 95,
                        "retries": 0,
                        "connect_timeout_s": args.timeout,
                        "read_timeout_s": args.timeout,
                    },
                    "reorganize_tar": {"tar_chunk_size": 1000},
                }
            }
        )
    )
    launched = datetime.now(UTC)
    seconds, peak, _ = run_measured([UNIRL, "ingest", str(recipe)], env=env)
    exited = datetime.now(UTC)
    stats = [json.loads(p.read_text()) for p in (out / "raw").glob("*_stats.json")]
    # over the units' span, the first unit's start to the last unit's end: units run side by side in the processes
    started = min(datetime.fromisoformat(s["start_time"]) for s in stats)
    ended = max(datetime.fromisoformat(s["end_time"]) for s in stats)
    in_flow = sum(s["successes"] for s in stats) / (ended - started).total_seconds()
    split = [(started - launched).total_seconds(), (ended - started).total_seconds(), (exited - ended).total_seconds()]
    print("  unirl: {:.2f} s to the first unit's start, {:.2f} s of units, {:.2f} s after the last".format(*split))
    return seconds, peak, {"ok": sum(s["successes"] for s in stats), "rows": sum(s["count"] for s in stats),
                           "unit_rate": in_flow}  # fmt: skip


def _bare_one(path: str) -> int:
    image = Image.open(path).convert("RGB")
    scale = 256 / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=95)
    return len(out.getvalue())


def run_bare(images: list[Path], processes: int) -> float:
    start = time.perf_counter()
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(_bare_one, [str(p) for p in images], chunksize=16))
    return time.perf_counter() - start


def start_prefect_server(home: Path) -> tuple[subprocess.Popen, dict]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    server = subprocess.Popen(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import urllib.request

    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1)
            return server, env
        except OSError:
            time.sleep(0.5)
    server.terminate()
    raise RuntimeError("the Prefect server did not start")


def report(label: str, seconds: float, result: dict) -> None:
    inside = f"; {result['unit_rate']:.1f} images/s inside the units" if "unit_rate" in result else ""
    print(
        f"{label:30} {result['ok'] / seconds:8.1f} images/s {result['rows'] / seconds:8.1f} rows/s  "
        f"({seconds:.1f} s end to end, {result['ok']} ok of {result['rows']} rows{inside})",
        flush=True,
    )


def compare_fault_free(args, images: list[Path], parquet: Path, base: str, env: dict) -> None:
    bare = None if args.skip_bare else run_bare(images, args.processes)
    if bare is not None:
        print(f"bare loop           {args.images / bare:8.1f} images/s  ({bare:.1f} s)", flush=True)
    unirl_s, rss_1x, unirl = run_unirl(parquet, args.work / "out-unirl", args, env)
    print(
        f"unirl ingest        {unirl['ok'] / unirl_s:8.1f} images/s  ({unirl_s:.1f} s end to end, "
        f"{unirl['unit_rate']:.1f} images/s inside the units, {unirl['ok']} ok)",
        flush=True,
    )
    binary = img2dataset_binary(args)
    if binary is not None:
        i2d_s, i2d = run_img2dataset(binary, parquet, args.work / "out-img2dataset", args)
        print(f"img2dataset 1.47    {i2d['ok'] / i2d_s:8.1f} images/s  ({i2d_s:.1f} s, {i2d['ok']} ok)", flush=True)
        print(f"ratio unirl / img2dataset   {(unirl['ok'] / unirl_s) / (i2d['ok'] / i2d_s):.2f}  (goal >= 1.5)")
    if bare is not None:
        print(f"ratio unirl / bare loop     {(unirl['ok'] / unirl_s) / (args.images / bare):.2f}  (goal >= 0.8)")
    if not args.skip_rss:
        rss = {1: rss_1x}
        for copies in (2, 4):
            many = write_input(args.work / f"input{copies}.parquet", base, args.images, copies=copies)
            _, rss[copies], _ = run_unirl(many, args.work / f"out-unirl-{copies}x", args, env)
        print(
            f"peak RSS unirl ingest: {rss[1]} MB at 1x, {rss[2]} MB at 2x, {rss[4]} MB at 4x the rows ({rss[4] / rss[2]:.2f}x "
            "from 2x to 4x; goal <= 1.2: from 2x on, every worker process a pool may open is open)"
        )


def compare_slow_hosts(args, clean: Path, faulty: Path, env: dict) -> None:
    """Both tools on the slow-host input; unirl (and img2dataset) on the fault-free input for their own ratio. The
    ratio to the fault-free run is in rows/s: the 5% dead rows can never be images."""
    clean_s, _, clean_run = run_unirl(clean, args.work / "out-unirl", args, env)
    report("unirl ingest, no faults", clean_s, clean_run)
    slow_s, rss, slow_run = run_unirl(faulty, args.work / "out-unirl-slow-hosts", args, env)
    report("unirl ingest, slow hosts", slow_s, slow_run)
    own = (slow_run["rows"] / slow_s) / (clean_run["rows"] / clean_s)
    print(f"peak RSS unirl ingest, slow hosts: {rss} MB", flush=True)
    binary = img2dataset_binary(args)
    if binary is not None:
        i2d_clean_s, i2d_clean = run_img2dataset(binary, clean, args.work / "out-img2dataset", args)
        report("img2dataset 1.47, no faults", i2d_clean_s, i2d_clean)
        i2d_s, i2d = run_img2dataset(binary, faulty, args.work / "out-img2dataset-slow-hosts", args)
        report("img2dataset 1.47, slow hosts", i2d_s, i2d)
        versus = (slow_run["ok"] / slow_s) / (i2d["ok"] / i2d_s)
        print(f"ratio unirl / img2dataset, slow hosts     {versus:.2f}  (images/s; goal >= 1.5)")
        i2d_own = (i2d["rows"] / i2d_s) / (i2d_clean["rows"] / i2d_clean_s)
        print(f"ratio img2dataset slow hosts / no faults  {i2d_own:.2f}  (rows/s)")
    print(f"ratio unirl slow hosts / no faults        {own:.2f}  (rows/s; goal >= 0.8)")


def compare(args) -> None:
    """Images, their loopback server and a Prefect server, then the fault-free or the slow-hosts comparison."""
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"generating {args.images} JPEGs (300-1500 px) in {args.work / 'images'} ...", flush=True)
    images = make_images(args.work / "images", args.images, args.processes)
    megabytes = sum(p.stat().st_size for p in images) / 1e6
    server, base = serve(images)
    dead, dead_base = serve_dead_host()
    parquet = write_input(args.work / "input.parquet", base, args.images)
    prefect, env = start_prefect_server(args.work / "prefect-home")
    compile_unirl()
    try:
        if args.slow_hosts:
            faulty = write_input(args.work / "input-slow-hosts.parquet", base, args.images, dead_base=dead_base)
            compare_slow_hosts(args, parquet, faulty, env)
        else:
            compare_fault_free(args, images, parquet, base, env)
        print(
            f"input: {args.images} images, {megabytes:.0f} MB; {args.processes} processes x {args.threads} threads; "
            f"timeout {args.timeout:g} s"
        )
    finally:
        server.shutdown()
        dead.shutdown()
        prefect.terminate()
        prefect.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds; both tools' connect and read timeout")
    parser.add_argument("--slow-hosts", action="store_true", help="5%% slow hosts (3 s), 5%% dead hosts")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "unirl-ingest-bench")
    parser.add_argument("--skip-img2dataset", action="store_true")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--skip-bare", action="store_true", help="no bare loop (150 s at 20,000 images)")
    parser.add_argument("--smoke", action="store_true", help="4 images, 1 process x 4 threads, a temporary --work, "
                        "no RSS check, img2dataset only if installed (make test's)")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="ingest-bench-smoke-") as work:
            args.images, args.processes, args.threads, args.timeout, args.skip_rss = 4, 1, 4, 5.0, True
            args.work = Path(work)
            compare(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
