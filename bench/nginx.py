"""nginx serving the synthetic site: one server per origin port, as a non-daemon child.

The config lives in a temporary prefix directory; nginx runs with ``daemon off`` so it is a child
of the driver, and :meth:`Nginx.stop` (or leaving the ``with`` block) ends it.

Usage (by hand): python bench/nginx.py SITE_DIR --origins 5 [--base-port 18001] [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


def nginx_binary() -> str:
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("nginx not found: apt-get install -y nginx")


def nginx_version() -> str:
    out = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True, check=False)
    return (out.stderr or out.stdout).strip().removeprefix("nginx version: ")


def http_common(prefix: Path) -> str:
    """The http block's settings every benchmark's nginx shares: types, keep-alive, temp paths."""
    return f"""    types {{ text/html html; text/plain txt; }}
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 65;
    keepalive_requests 100000;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
"""


def render_config(site_dir: Path, origins: int, base_port: int, prefix: Path) -> str:
    user = "user root root;\n" if os.geteuid() == 0 else ""
    servers = []
    for i in range(origins):
        servers.append(f"""
    server {{
        listen 127.0.0.1:{base_port + i} backlog=4096;
        server_name 127.0.0.1;
        root {site_dir.resolve() / f"o{i}"};
        location ~ ^/r/(\\d+)\\.html$ {{ return 301 /p/$1.html; }}
        location ~ ^/rr/(\\d+)\\.html$ {{ return 301 /r/$1.html; }}
        location / {{ try_files $uri $uri/index.html =404; }}
    }}""")
    return f"""{user}worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
{http_common(prefix)}    access_log off;
    tcp_nopush on;
    # no open_file_cache: it holds one fd per file served recently, and at a few hundred
    # pages/s that ran into the fd limit, turning try_files into 404s
{"".join(servers)}
}}
"""


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Nginx:
    """Start with :meth:`start`, stop with :meth:`stop`; also a context manager."""

    def __init__(self, site_dir: Path, origins: int, base_port: int = 18001) -> None:
        self.site_dir = site_dir
        self.origins = origins
        self.base_port = base_port
        self.prefix = Path(tempfile.mkdtemp(prefix="courtly-bench-nginx-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        for i in range(self.origins):
            if _port_open(self.base_port + i):
                shutil.rmtree(self.prefix, ignore_errors=True)
                raise SystemExit(f"port {self.base_port + i} already in use")
        conf = self.prefix / "nginx.conf"
        conf.write_text(render_config(self.site_dir, self.origins, self.base_port, self.prefix))
        self.proc = subprocess.Popen(
            [nginx_binary(), "-p", str(self.prefix), "-c", str(conf), "-g", "daemon off;"],
            stdin=subprocess.DEVNULL,
            stderr=open(self.prefix / "stderr.log", "wb"),  # noqa: SIM115 - lives with the child
        )
        deadline = time.monotonic() + timeout
        last = self.base_port + self.origins - 1
        while not (_port_open(self.base_port) and _port_open(last)):
            if self.proc.poll() is not None:
                err = (self.prefix / "stderr.log").read_text(errors="replace")
                self.stop()
                raise SystemExit(f"nginx exited: {err}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("nginx did not start listening in time")
            time.sleep(0.05)

    def error_log_problems(self) -> list[str]:
        """Lines of nginx's error log at level error or worse (a broken run shows here)."""
        log = self.prefix / "error.log"
        if not log.exists():
            return []
        lines = log.read_text(errors="replace").splitlines()
        return [x for x in lines if any(f"[{lv}]" in x for lv in ("error", "crit", "alert",
                                                                    "emerg"))]

    def stop(self) -> None:
        problems = self.error_log_problems()
        if problems:
            print(f"nginx error log: {len(problems)} problem lines, e.g. {problems[:3]}",
                  flush=True)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: master stops its workers
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.prefix, ignore_errors=True)

    def __enter__(self) -> Nginx:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("site_dir", type=Path)
    ap.add_argument("--origins", type=int, required=True)
    ap.add_argument("--base-port", type=int, default=18001)
    ap.add_argument("--seconds", type=float, default=60.0, help="serve this long, then stop")
    args = ap.parse_args()
    with Nginx(args.site_dir, args.origins, args.base_port):
        print(f"serving {args.origins} origins from port {args.base_port} for {args.seconds}s")
        time.sleep(args.seconds)


if __name__ == "__main__":
    main()
