"""A throwaway PostgreSQL server on 127.0.0.1 from Debian's packages.

PostgreSQL refuses to run as root, so as root the data directory belongs to the
`postgres` system user and the server runs as that user.
"""

import glob
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from gpustack_dspark.devstack.ports import free_port

DATABASE = "gpustack"


def find_bin_dir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    for candidate in reversed(candidates):
        if os.access(os.path.join(candidate, "pg_ctl"), os.X_OK):
            return Path(candidate)
    raise RuntimeError(
        "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin; "
        "install them with: apt-get install -y postgresql"
    )


def _as_db_user() -> List[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--"]
    return []


@dataclass
class Postgres:
    data_dir: Path
    port: int
    user: str = "dspark"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(_as_db_user() + list(argv), check=check, capture_output=True, text=True)

    def start(self, timeout_s: float = 60) -> "Postgres":
        bin_dir = find_bin_dir()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.data_dir, "postgres", "postgres")
            # runuser needs to traverse to the data dir
            for parent in self.data_dir.parents:
                if parent == Path("/"):
                    break
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.user,
                      "-A", "trust", "-E", "UTF8", "--no-sync")
        result = self._run(
            str(bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.data_dir / "server.log"),
            "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data_dir} -c fsync=off",
            "-w", "-t", str(int(timeout_s)), "start", check=False,
        )
        if result.returncode != 0:
            log = (self.data_dir / "server.log")
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr.strip()}\n{tail}")
        self._create_database(bin_dir, timeout_s)
        return self

    def _create_database(self, bin_dir: Path, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            probe = self._run(str(bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                              "-U", self.user, "-d", "postgres", "-tAc",
                              f"SELECT 1 FROM pg_database WHERE datname='{DATABASE}'", check=False)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL not answering: {probe.stderr.strip()}")
            time.sleep(0.3)
        if probe.stdout.strip() != "1":
            self._run(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                      "-U", self.user, DATABASE)

    def stop(self) -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._run(str(find_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop",
                  check=False)

    def psql(self, sql: str) -> str:
        """One query's rows, unaligned (tests read GPUStack's tables with it)."""
        result = self._run(str(find_bin_dir() / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                           "-d", DATABASE, "-tAXc", sql)
        return result.stdout.strip()

    def reset(self) -> None:
        """Drop and recreate the database (a clean GPUStack between tests)."""
        bin_dir = find_bin_dir()
        common = ["-h", "127.0.0.1", "-p", str(self.port), "-U", self.user]
        self._run(str(bin_dir / "dropdb"), *common, "--if-exists", "--force", DATABASE)
        self._run(str(bin_dir / "createdb"), *common, DATABASE)


def start_postgres(data_dir: Path, port: Optional[int] = None) -> Postgres:
    return Postgres(data_dir=data_dir, port=port or free_port()).start()
