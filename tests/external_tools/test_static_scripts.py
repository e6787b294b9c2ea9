"""The API's page scripts (turnlog/api/static/*.js) parse: a syntax error there leaves a page
with no handlers, which only a browser test would otherwise find (Node.js is on every machine
this project runs on: `node --check` parses without running)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import turnlog.api

STATIC = Path(turnlog.api.__file__).parent / "static"
SCRIPTS = sorted(STATIC.glob("*.js"))


def test_there_are_page_scripts_to_check():
    assert {script.name for script in SCRIPTS} >= {"live.js", "ops.js"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_each_page_script_parses(script):
    node = shutil.which("node")
    assert node is not None, "node (Node.js) is needed to check the page scripts' syntax"
    checked = subprocess.run([node, "--check", str(script)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
