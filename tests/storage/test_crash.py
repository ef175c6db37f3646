"""An acknowledged write survives SIGKILL: a real process writes through SQLiteStore, is
killed mid-burst, and every id it printed (after its put returned) is in the file, whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tokenwire
from tests.storage import crash_writer
from tokenwire.storage import SQLiteStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ACKED_BEFORE_KILL = 300


async def test_sigkill_loses_no_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "crash.sqlite3"
    src = Path(tokenwire.__file__).parents[1]  # the tokenwire this test run imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(Path.cwd())])}
    proc = subprocess.Popen([sys.executable, crash_writer.__file__, str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acked.append(line.strip())
            if len(acked) == ACKED_BEFORE_KILL:
                proc.send_signal(signal.SIGKILL)
                break
        # what it printed before dying was acknowledged too
        acked += [line.strip() for line in proc.stdout if line.strip()]
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err
    assert len(acked) >= ACKED_BEFORE_KILL, err

    store = SQLiteStore(path)
    try:
        for id in acked:
            i = int(id.split("-")[1])
            if id.startswith("doc-"):
                doc = await store.get_document("crash", id)
                assert doc is not None, id
                assert doc.token_ids == crash_writer.prompt_of(i)
            else:
                rec = await store.get_completion("crash", id)
                assert rec is not None, id
                assert rec.prompt_ids == crash_writer.prompt_of(i)
                assert rec.request == {"i": i, "pad": "x" * (i % 300)}
                assert (rec.response, rec.metadata) == ({"i": i}, {"i": str(i)})
        # and the file is consistent beyond them (a write in flight at the kill is all or none)
        assert await store._run(lambda c: c.execute("PRAGMA integrity_check").fetchone()) \
            == ("ok",)
    finally:
        await store.aclose()

