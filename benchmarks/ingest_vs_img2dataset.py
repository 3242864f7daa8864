"""unirl ingest vs img2dataset 1.47 vs the bare CPU loop, on the same JPEGs served from a loopback HTTP server.

    .venv/bin/python benchmarks/ingest_vs_img2dataset.py [--images 2000] [--processes 2] [--threads 16]

- Generates `--images` photo-like JPEGs of mixed sizes (300-1500 px), cached in --work.
- Serves them from a loopback HTTP server in this process (both tools fetch over real HTTP).
- img2dataset 1.47 runs from its own virtualenv (its pins, webdataset<0.3 and pandas<3, conflict with ours); the
  script creates it with pip on first use.
- unirl ingest runs as the `unirl ingest` command against a local Prefect server started here (as `make serve`
  would), so the ephemeral server's start-up is not counted; its own in-flow rate is printed too.
- The bare loop decodes, resizes (keep_ratio 256, Lanczos) and encodes (quality 95) the same bytes in
  `--processes` processes: the CPU limit of the work itself.
- Peak RSS of `unirl ingest` with 1x and 4x the rows (the same images under 4 URLs each).

Same settings everywhere: keep_ratio 256, JPEG quality 95, the same process and thread counts.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
UNIRL = str(Path(sys.executable).parent / "unirl")
PREFECT = str(Path(sys.executable).parent / "prefect")


def photo_like(width: int, height: int, seed: int) -> bytes:
    """Smooth gradients, blobs and sensor-like noise: compresses like a photo (about 1-3 bits per pixel)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(2, height // 64), max(2, width // 64), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    noise = rng.normal(0, 8, (height, width, 3))
    out = io.BytesIO()
    Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def make_images(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = folder / f"{i:05d}.jpg"
        if not path.exists():
            width, height = (int(v) for v in rng.integers(300, 1501, 2))
            path.write_bytes(photo_like(width, height, seed=i))
        else:
            rng.integers(300, 1501, 2)
        paths.append(path)
    return paths


def serve(images: list[Path]) -> tuple[ThreadingHTTPServer, str]:
    bodies = [p.read_bytes() for p in images]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            index = int(self.path.rsplit("/", 1)[-1].split(".")[0].split("-")[0])
            body = bodies[index]
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def write_input(path: Path, base: str, count: int, copies: int = 1) -> Path:
    rows = [
        {"url": f"{base}/{i:05d}-{c}.jpg", "caption": f"benchmark image {i} copy {c}"}
        for c in range(copies)
        for i in range(count)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def run_measured(command: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in MB of the process (and the children it waited for), and its stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            raise RuntimeError(f"{command[0]} failed:\n{err.read()[-3000:]}")
        return seconds, usage.ru_maxrss // 1024, out.read()


def ensure_img2dataset(venv: Path) -> Path:
    binary = venv / "bin" / "img2dataset"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "img2dataset==1.47"], check=True)
    return binary


def run_img2dataset(binary: Path, parquet: Path, out: Path, args) -> tuple[float, int]:
    shutil.rmtree(out, ignore_errors=True)
    command = [
        str(binary), "--url_list", str(parquet), "--input_format", "parquet", "--url_col", "url",
        "--caption_col", "caption", "--output_format", "webdataset", "--output_folder", str(out),
        "--processes_count", str(args.processes), "--thread_count", str(args.threads),
        "--image_size", "256", "--resize_mode", "keep_ratio", "--encode_quality", "95",
        "--number_sample_per_shard", "1000", "--timeout", "10", "--retries", "0",
        "--disallowed_header_directives", "[]", "--enable_wandb", "False",
    ]  # fmt: skip
    seconds, _, _ = run_measured(command)
    ok = sum(json.loads(p.read_text())["successes"] for p in out.glob("*_stats.json"))
    return seconds, ok


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
                    },
                    "reorganize_tar": {"tar_chunk_size": 1000},
                }
            }
        )
    )
    seconds, peak, _ = run_measured([UNIRL, "ingest", str(recipe)], env=env)
    stats = [json.loads(p.read_text()) for p in (out / "raw").glob("*_stats.json")]
    in_flow = sum(s["successes"] for s in stats) / max(s["duration"] for s in stats)
    return seconds, peak, {"ok": sum(s["successes"] for s in stats), "unit_rate": in_flow}


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "unirl-ingest-bench")
    parser.add_argument("--skip-img2dataset", action="store_true")
    parser.add_argument("--skip-rss", action="store_true")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    print(f"generating {args.images} JPEGs (300-1500 px) in {args.work / 'images'} ...", flush=True)
    images = make_images(args.work / "images", args.images)
    megabytes = sum(p.stat().st_size for p in images) / 1e6
    server, base = serve(images)
    parquet = write_input(args.work / "input.parquet", base, args.images)
    prefect, env = start_prefect_server(args.work / "prefect-home")
    try:
        bare = run_bare(images, args.processes)
        print(f"bare loop           {args.images / bare:8.1f} images/s  ({bare:.1f} s)", flush=True)
        unirl_s, rss_1x, unirl = run_unirl(parquet, args.work / "out-unirl", args, env)
        print(
            f"unirl ingest        {unirl['ok'] / unirl_s:8.1f} images/s  ({unirl_s:.1f} s end to end, "
            f"{unirl['unit_rate']:.1f} images/s inside the units, {unirl['ok']} ok)",
            flush=True,
        )
        if not args.skip_img2dataset:
            binary = ensure_img2dataset(args.work / "img2dataset-venv")
            i2d_s, i2d_ok = run_img2dataset(binary, parquet, args.work / "out-img2dataset", args)
            print(f"img2dataset 1.47    {i2d_ok / i2d_s:8.1f} images/s  ({i2d_s:.1f} s, {i2d_ok} ok)", flush=True)
            print(f"ratio unirl / img2dataset   {(unirl['ok'] / unirl_s) / (i2d_ok / i2d_s):.2f}  (goal >= 1.5)")
        print(f"ratio unirl / bare loop     {(unirl['ok'] / unirl_s) / (args.images / bare):.2f}  (goal >= 0.8)")
        if not args.skip_rss:
            parquet4 = write_input(args.work / "input4.parquet", base, args.images, copies=4)
            _, rss_4x, _ = run_unirl(parquet4, args.work / "out-unirl-4x", args, env)
            print(f"peak RSS unirl ingest: {rss_1x} MB at 1x, {rss_4x} MB at 4x ({rss_4x / rss_1x:.2f}x; goal <= 1.2)")
        print(f"input: {args.images} images, {megabytes:.0f} MB; {args.processes} processes x {args.threads} threads")
    finally:
        server.shutdown()
        prefect.terminate()
        prefect.wait(timeout=30)


if __name__ == "__main__":
    main()
