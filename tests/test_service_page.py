"""The page at / in a real headless Chromium (the operating system's package, driven by
Playwright): sign in with a token, see the granted dataset, make a release, see the gauge move
and the marginal plots drawn from the artifact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "",
                             shutil.which("chromium-browser") or "") if p and Path(p).exists()),
                None)
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture
def browser(need_component):
    need = need_component
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need("Playwright is not installed (pip install playwright)")
    if CHROMIUM is None:
        need("Chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def test_page_signs_in_releases_and_moves_the_gauge(tmp_path, browser, service_process):
    from klrelease.service.datadir import ledger_url
    from klrelease.service.datasets import registration
    from klrelease.service.ledger import Ledger

    data = tmp_path / "data"
    led = Ledger(ledger_url(data))
    led.create_schema()
    led.add_dataset(registration("iris", bundled="iris", budget_epsilon=10.0,
                                 budget_delta=1e-5))
    led.add_dataset(registration("hidden", bundled="iris", budget_epsilon=1.0,
                                 budget_delta=1e-5))
    token = led.create_token("analyst", "alice", ["iris"])[1]
    server = service_process(data)
    page = browser.new_page(viewport={"width": 1180, "height": 900})
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_selector("#sign-in:not([hidden])")

    page.fill("#token", "klr_" + "A" * 43)
    page.click("#sign-in-form button")
    page.wait_for_selector("#sign-in-error:has-text('not valid')")

    page.fill("#token", token)
    page.click("#sign-in-form button")
    card = page.wait_for_selector("[data-testid=dataset-iris]")
    assert page.locator("[data-testid^=dataset-]").count() == 1  # "hidden" is not granted
    assert "alice" in page.inner_text("#who-name")
    gauge = page.locator("[data-testid=dataset-iris] [data-testid=gauge]")
    assert float(gauge.get_attribute("data-fraction")) == 0.0
    assert card.query_selector(".pct").text_content() == "0%"
    assert page.locator("select[name=mechanism] option").first.inner_text() == "kl-certified"

    def release(epsilon: str) -> None:
        rows = page.locator("tr.release").count()
        page.fill("[data-testid=dataset-iris] input[name=epsilon]", epsilon)
        page.fill("[data-testid=dataset-iris] input[name=delta]", "1e-6")
        page.click("[data-testid=dataset-iris] button.primary")
        page.wait_for_function(
            "n => document.querySelectorAll('tr.release').length > n", arg=rows)

    release("1")
    page.wait_for_selector(".form-status.ok")
    first = float(gauge.get_attribute("data-fraction"))
    assert first > 0 and card.query_selector(".pct").text_content() != "0%"
    # the plots are drawn from the artifact: one curve per class and feature, the weights
    # of the artifact in the legend
    page.wait_for_selector("[data-testid=marginals]")
    assert page.locator("[data-testid=marginals] path.curve").count() == 3 * 4
    rid = page.locator("tr.release").first.get_attribute("data-request-id")
    import httpx

    art = json.loads(httpx.get(f"{server.url}/v1/datasets/iris/releases/{rid}",
                               headers={"Authorization": f"Bearer {token}"}).text)
    legend = page.inner_text("[data-testid=marginals] .legend")
    for cls, w in zip(art["gmm"]["classes"], art["gmm"]["weights"], strict=True):
        assert f"{cls} (weight {w:.3f})" in legend
    assert art["signature"]["key_id"] in page.inner_text("[data-testid=marginals]")

    release("2")
    second = float(gauge.get_attribute("data-fraction"))
    assert second > first  # the gauge moved again
    assert page.locator("tr.release").count() == 2
    assert "alice" in page.inner_text("tr.release >> nth=0")

    # a request the budget cannot pay is refused with the service's message
    page.fill("[data-testid=dataset-iris] input[name=epsilon]", "500")
    page.click("[data-testid=dataset-iris] button.primary")
    page.wait_for_selector(".form-status.error")
    assert "budget exceeded" in page.inner_text(".form-status")
    assert float(gauge.get_attribute("data-fraction")) == second

    # the token stays for this tab: a reload shows the datasets again
    page.reload()
    page.wait_for_selector("[data-testid=dataset-iris]")
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    assert (tmp_path / "page.png").stat().st_size > 20_000
    assert all(u.startswith(server.url) or u.startswith("data:") for u in requests), requests
    assert errors == []
    page.click("#sign-out")
    page.wait_for_selector("#sign-in:not([hidden])")
    assert page.evaluate("sessionStorage.length") == 0
    led.close()
