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


def test_make_run_keeps_the_allowlist_in_dotenv_where_every_command_reads_it(tmp_path):
    # A second shell's manage.py command reads .env, not `make run`'s environment: the
    # Makefile exports no allowlist, and `make run` writes it into .env when .env lacks it.
    makefile = (ROOT / "Makefile").read_text()
    assert not re.search(r"^export\b.*A2A_WEBHOOK_ALLOWED_NETWORKS", makefile, re.M)
    plan = subprocess.run(
        ["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    [write] = re.findall(r"^grep -qs .*?(?=^\S*python)", plan, re.M | re.S)
    assert plan.find(write) < plan.find("manage.py run_platform")
    # Run the recipe's line in a directory of its own: it writes the line once.
    for _ in range(2):
        subprocess.run(["bash", "-c", write], cwd=tmp_path, check=True, capture_output=True)
    lines = (tmp_path / ".env").read_text().splitlines()
    assert [x for x in lines if not x.startswith("#")] == [
        "A2A_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,::1/128"
    ]
    # A .env that sets it (even empty) is the developer's: left alone.
    (tmp_path / ".env").write_text("A2A_WEBHOOK_ALLOWED_NETWORKS=\n")
    subprocess.run(["bash", "-c", write], cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / ".env").read_text() == "A2A_WEBHOOK_ALLOWED_NETWORKS=\n"
    # The tests get it on their command line.
    tests = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "A2A_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,::1/128" in tests


def test_every_manage_py_command_in_the_readme_names_the_venvs_python():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(.*\bmanage\.py\b.*)$", readme, re.M)
    assert commands, "the README shows manage.py commands"
    bare = [line for line in commands if re.search(r"(?<![/\w.])python3? manage\.py", line)]
    assert bare == []
