"""The README's promises to a newcomer (issue 18): its two commands set up what the tests
need, and every command it shows runs from a fresh clone without an activated venv."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_test_installs_the_browser_before_it_runs_the_tests():
    # A dry run prints what `make test` would do, in order, without doing it.
    plan = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    browser = plan.find("apt-get install -y -qq chromium")
    pytest_run = plan.find("-m pytest")
    assert browser != -1, plan
    assert pytest_run != -1, plan
    assert browser < pytest_run
    # Only when it is missing, and with a hint where it cannot install it.
    assert "test -x /usr/bin/chromium" in plan
    assert "sudo apt-get install chromium" in plan


def test_make_test_installs_promtool_alone_before_it_runs_the_tests():
    plan = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    # Only promtool, unpacked from Debian's package: never the server and its service.
    install = plan.find("apt-get download -qq -o APT::Sandbox::User=root prometheus")
    assert install != -1, plan
    assert install < plan.find("-m pytest")
    assert "command -v promtool" in plan
    assert "tar -xO ./usr/bin/promtool > /usr/local/bin/promtool" in plan
    assert "apt-get install -y -qq prometheus" not in plan
    assert "sudo make promtool" in plan


def test_every_manage_py_command_in_the_readme_names_the_venvs_python():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(.*\bmanage\.py\b.*)$", readme, re.M)
    assert commands, "the README shows manage.py commands"
    bare = [line for line in commands if re.search(r"(?<![/\w.])python3? manage\.py", line)]
    assert bare == []
