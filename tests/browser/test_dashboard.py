"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright.

Against a live `harness serve` (a subprocess on an ephemeral port, the
example orchestrator deployment plus a slow profile) with sessions running:
the page loads with no console errors, lists the sessions (the orchestrator's
subagents under it), shows live events within 2 s of their commit, renders
the inspect view, sends a prompt whose turn completes and cancels a running
turn; it stays responsive with 1,000 live sessions. Screenshots of each state
go to the test's tmp dir and are checked.

Run with `make test-browser` (it installs chromium with apt-get when missing).
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-test-token"
DOCS_SCREENSHOT = ROOT / "docs" / "dashboard.png"

SLOW_PROFILE = """
[providers.slow]
kind = "simulator"
token_rate = 4
reply_tokens = 400

[agents.slow]
provider = "slow"
model = "deepseek-chat"
persona = "You are deliberately slow."
"""


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A live `harness serve` on an ephemeral port; yields the dashboard URL."""
    root = tmp_path_factory.mktemp("serve")
    config = root / "deploy.toml"
    config.write_text((ROOT / "examples" / "orchestrator.toml").read_text() + SLOW_PROFILE)
    (root / "README.txt").write_text("a file for the workers to find")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervision.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            "0",
            "--token",
            TOKEN,
            "--store",
            str(root / "sessions.sqlite"),
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    dashboard = None
    for _ in range(10):
        line = process.stdout.readline()
        match = re.match(r"dashboard (http://\S+)", line)
        if match:
            dashboard = match.group(1)
            break
    assert dashboard is not None, process.stderr.read() if process.stderr else ""
    try:
        yield dashboard
    finally:
        process.send_signal(signal.SIGINT)
        _, errors = process.communicate(timeout=30)
        assert process.returncode == 0, errors


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, server: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(f"console {message.type}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.goto(f"{server}#token={TOKEN}")
    expect(page.locator("#connection")).to_have_attribute("data-state", "open")
    yield page
    context.close()
    assert problems == []


def new_session(page: Page, agent: str) -> str:
    page.fill("#new-agent", agent)
    page.click("#new-session-form button")
    expect(page.locator("#notice")).to_contain_text("started session")
    title = page.locator("#detail-title")
    expect(title).not_to_be_empty()
    return title.inner_text()


def send(page: Page, text: str) -> None:
    page.fill("#prompt-input", text)
    page.click("#send-button")


def shot(page: Page, tmp_path: Path, name: str, *visible: str) -> Path:
    for selector in visible:
        expect(page.locator(selector).first).to_be_visible()
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    width, height = png_size(path)
    assert width >= 1440 and height >= 900
    return path


def test_the_token_stays_out_of_the_url_and_in_session_storage(page: Page) -> None:
    assert "token" not in page.url
    assert page.evaluate("sessionStorage.getItem('harness.token')") == TOKEN
    assert page.evaluate("localStorage.length") == 0


def test_without_a_token_the_page_asks_for_one(browser: Browser, server: str) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(server)
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token-input", TOKEN)
    page.click("#login-form button")
    expect(page.locator("#connection")).to_have_attribute("data-state", "open")
    context.close()


def test_sessions_live_events_inspect_prompt_and_cancel(page: Page, tmp_path: Path) -> None:
    # A running orchestrator whose worker is a subagent: the list shows the tree.
    orchestrator = new_session(page, "orchestrator")
    send(
        page,
        'Split the work.\ncall subagent {"prompt": "look\\ncall list_files {}", "label": "survey"}',
    )
    expect(page.locator("#prompt-status")).to_contain_text("turn ended: end_turn", timeout=20_000)
    rows = page.locator(".session-row")
    expect(rows).to_have_count(2)
    expect(page.locator(".session-row .child")).to_have_count(1)
    expect(page.locator(f'.session-row[data-session="{orchestrator}"]')).to_contain_text(
        "orchestrator"
    )
    shot(page, tmp_path, "1-sessions", ".session-row", "#events .event")

    # Live events: each shown within 2 s of being appended to the log.
    send(page, "Thanks. Now summarise.")
    expect(page.locator("#prompt-status")).to_contain_text("turn ended: end_turn", timeout=20_000)
    live = page.eval_on_selector_all(
        "#events .event[data-seq]",
        "rows => rows.map(r => [Number(r.dataset.seq),"
        " Number(r.dataset.received) - Number(r.dataset.time)])",
    )
    turn_end = page.locator('#events .event[data-type="turn/end"]')
    expect(turn_end).to_have_count(2)
    assert live and all(delay <= 2000 for _, delay in live), live
    shot(page, tmp_path, "2-live-events", '#events .event[data-type="turn/end"]')

    # The inspect view: sections with order and owning scope, tools in order.
    expect(page.locator('#inspect-sections tr[data-section="harness:identity"]')).to_contain_text(
        "global"
    )
    persona = page.locator('#inspect-sections tr[data-section="deployment:persona"]')
    expect(persona).to_contain_text(f"agent:{orchestrator}")
    tools = page.locator("#inspect-tools tr[data-tool]")
    expect(tools).to_have_count(2)
    assert tools.nth(0).get_attribute("data-tool") == "subagent"
    shot(page, tmp_path, "3-inspect", "#inspect-sections", "#inspect-tools")

    # The cache chart and its link to the prefix report.
    bars = page.locator("#cache-chart .req")
    expect(bars).to_have_count(3)
    bars.nth(2).click()
    expect(page.locator("#cache-break")).to_contain_text("only appended to the previous request")
    shot(page, tmp_path, "4-cache", "#cache-chart", "#cache-break")

    # Cancel a running turn of a slow agent.
    new_session(page, "slow")
    send(page, "Tell me a long story.")
    expect(page.locator('#events .event[data-type="assistant/chunk"]')).to_have_count(1)
    shot(page, tmp_path, "5-running", '#events .event[data-type="assistant/chunk"]')
    page.click("#cancel-button")
    expect(page.locator("#prompt-status")).to_contain_text("turn ended: cancelled")
    expect(page.locator('#events .event[data-type="turn/end"]')).to_contain_text("aborted (user)")
    shot(page, tmp_path, "6-cancelled", '#events .event[data-type="turn/end"]')

    # The orchestrator again, for the picture in the docs.
    page.click(f'.session-row[data-session="{orchestrator}"]')
    expect(page.locator("#inspect-sections")).to_be_visible()
    expect(page.locator("#cache-chart .req")).to_have_count(3)
    bars.nth(1).click()
    expect(page.locator("#cache-break")).to_contain_text(
        re.compile(r"request 1 .*(bytes kept|BREAK)")
    )
    path = shot(page, tmp_path, "7-full-page", "#inspect-sections", "#cache-chart .req")
    if os.environ.get("HARNESS_UPDATE_DOCS_SCREENSHOT"):
        DOCS_SCREENSHOT.write_bytes(path.read_bytes())


def test_a_thousand_live_sessions_stay_responsive(page: Page, tmp_path: Path) -> None:
    created = page.evaluate(
        """async () => {
            const ids = [];
            for (let batch = 0; batch < 20; batch++) {
                const calls = [];
                for (let i = 0; i < 50; i++) {
                    calls.push(state.conn.call("session/new",
                        {cwd: "/", mcpServers: [], _meta: {harness: {agent: "default"}}}));
                }
                for (const r of await Promise.all(calls)) ids.push(r.sessionId);
            }
            return ids.length;
        }"""
    )
    assert created == 1000
    expect(page.locator("#session-count")).to_contain_text(re.compile(r"\((1\d{3})\)"))
    rendered = page.locator(".session-row").count()
    assert 0 < rendered < 80  # virtualised: only the visible rows exist
    page.evaluate(
        """() => {
            const v = document.getElementById("session-viewport");
            v.scrollTop = v.scrollHeight;
            v.dispatchEvent(new Event("scroll"));
        }"""
    )
    assert page.locator(".session-row").count() < 80  # still only the visible rows
    last = page.locator(".session-row").last
    expect(last).to_be_visible()
    last.click()
    expect(page.locator("#session-detail")).to_be_visible()
    page.fill("#session-filter", last.get_attribute("data-session") or "")
    expect(page.locator(".session-row")).to_have_count(1)
    shot(page, tmp_path, "8-thousand", ".session-row")
