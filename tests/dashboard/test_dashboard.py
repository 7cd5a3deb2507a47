"""End to end in a real headless Chromium: a running ``tripwire serve`` fed real OTLP; a looping
agent shows as stuck within seconds, clicking Kill raises the flag (checked through the kill
channel), filters work, and every page is screenshotted into the test artifacts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.conftest import TOKEN, Running, running_service
from serve.otlp_helpers import loop_spans, protobuf_body, trace_id_of
from tripwire.serve import ServeConfig
from tripwire.store.runs import RunStore

from .conftest import ARTIFACTS

PB = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Running]:
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    with running_service(config, store) as r:
        yield r
    store.dispose()


def _page(browser: Any, r: Running) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{r.url}/")
    # Not signed in: the dashboard asks for the token.
    assert page.url.startswith(f"{r.url}/login")
    page.get_by_label("Bearer token (TRIPWIRE_TOKEN)").fill(TOKEN)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{r.url}/")
    return page


def _distinct_spans(n: int) -> tuple[Any, ...]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    words = ("billing", "shipping", "returns", "warranty", "invoices", "accounts")
    with tracer.start_as_current_span("invoke_agent helper", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"}):
        for i in range(n):
            with tracer.start_as_current_span("execute_tool search_docs", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs", "gen_ai.tool.call.id": f"d{i}",
                "gen_ai.tool.call.arguments": json.dumps({"query": words[i % len(words)]}), "gen_ai.tool.call.result": f"about {words[i % len(words)]}",
            }):
                pass
    provider.shutdown()
    return tuple(exporter.get_finished_spans())


def test_a_looping_agent_shows_stuck_and_kill_raises_its_flag(browser: Any, live: Running) -> None:
    page = _page(browser, live)
    page.screenshot(path=str(ARTIFACTS / "dashboard-fleet-empty.png"), full_page=True)
    # A looping run still going (no root span yet): its spans arrive while the page is open.
    spans = loop_spans(6)
    tid = trace_id_of(spans)
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    started = time.monotonic()
    assert httpx.post(f"{live.url}/v1/traces", content=protobuf_body(tools), headers=PB).status_code == 200
    # The Fleet page updates itself (no reload): one stuck run within seconds.
    page.locator('[data-verdict="stuck"]', has_text="1").wait_for(timeout=10_000)
    assert time.monotonic() - started < 10
    page.screenshot(path=str(ARTIFACTS / "dashboard-fleet.png"), full_page=True)
    # The Runs page, filtered on stuck, lists it; keyboard-only navigation to it.
    page.get_by_role("link", name="Runs").click()
    page.get_by_label("Verdict").select_option("stuck")
    page.get_by_role("button", name="Filter").click()
    row = page.locator(f'tr[data-run="{tid}"]')
    row.wait_for()
    page.screenshot(path=str(ARTIFACTS / "dashboard-runs.png"), full_page=True)
    row.get_by_role("link").focus()
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live.url}/runs/{tid}")
    assert "stuck" in page.locator('[data-field="verdict"]').inner_text()
    # The service already raised the flag when it judged the run stuck; resolve lowers it...
    page.get_by_role("button", name="Resolve").click()
    page.get_by_role("status").wait_for()
    assert live.service.kill.get(tid, time.time()) is None
    assert page.locator('[data-field="flag"]').inner_text() == "down"
    # ...and clicking Kill raises it again, by the operator: checked through the kill channel.
    page.get_by_role("button", name="Kill (raise the flag)").click()
    page.get_by_role("status").wait_for()
    flag = live.service.kill.get(tid, time.time())
    assert flag is not None and flag["by"] == "operator"
    assert "up" in page.locator('[data-field="flag"]').inner_text()
    assert page.locator("table").nth(1).locator("tbody tr").count() >= 1  # the verdict history
    page.screenshot(path=str(ARTIFACTS / "dashboard-run.png"), full_page=True)


def test_filters_select_runs_and_a_healthy_run_is_not_stuck(browser: Any, live: Running) -> None:
    looping, healthy = loop_spans(5), _distinct_spans(8)
    for spans in (looping, healthy):
        assert httpx.post(f"{live.url}/v1/traces", content=protobuf_body(spans), headers=PB).status_code == 200
    page = _page(browser, live)
    page.goto(f"{live.url}/runs?since=24h")
    page.locator(f'tr[data-run="{trace_id_of(healthy)}"]').wait_for()
    assert page.locator("tbody tr[data-run]").count() == 2
    page.get_by_label("Agent").select_option("helper")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**agent=helper**")
    rows = page.locator("tbody tr[data-run]")
    assert rows.count() == 1 and "working" in rows.first.inner_text()
    page.get_by_label("Agent").select_option("")
    page.get_by_label("Stop reason").select_option("loop_detected")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**stop_reason=loop_detected**")
    rows = page.locator("tbody tr[data-run]")
    assert rows.count() == 1 and rows.first.get_attribute("data-run") == trace_id_of(looping)
    page.screenshot(path=str(ARTIFACTS / "dashboard-runs-filtered.png"), full_page=True)


def test_the_dashboard_needs_the_token_and_serves_its_own_assets(live: Running) -> None:
    assert httpx.get(f"{live.url}/runs", follow_redirects=False).status_code == 303
    assert httpx.get(f"{live.url}/fragments/fleet").status_code == 401
    bad = httpx.post(f"{live.url}/login", data={"token": "nope-not-the-token", "next": "/"}, follow_redirects=False)
    assert bad.status_code == 401
    css = httpx.get(f"{live.url}/static/tripwire.css")
    assert css.status_code == 200 and "verdict-stuck" in css.text
    ok = httpx.get(f"{live.url}/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    assert "https://" not in ok.text and "http://" not in ok.text  # nothing fetched from elsewhere
    for path in ("/runs", "/fragments/runs"):  # a page past any store: empty, not a 500
        far = httpx.get(f"{live.url}{path}?offset=99999999999999999999", headers={"Authorization": f"Bearer {TOKEN}"})
        assert far.status_code == 200, path
    # A form post without the CSRF token is refused.
    spans = loop_spans(2)
    httpx.post(f"{live.url}/v1/traces", content=protobuf_body(spans), headers=PB)
    forged = httpx.post(f"{live.url}/runs/{trace_id_of(spans)}/kill", headers={"Authorization": f"Bearer {TOKEN}"}, data={"csrf": "x"})
    assert forged.status_code == 403


def test_the_dashboards_actions_are_the_apis_a_resolved_run_that_repeats_is_stopped_again_and_an_unknown_run_is_refused(live: Running) -> None:
    import re

    spans = loop_spans(7)
    tid = trace_id_of(spans)
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    assert httpx.post(f"{live.url}/v1/traces", content=protobuf_body(tools[:6]), headers=PB).status_code == 200
    assert live.service.kill.get(tid, time.time()) is not None  # stuck: up with the request
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=live.url, headers=auth) as client:
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get(f"/runs/{tid}").text)
        assert csrf is not None
        resolved = client.post(f"/runs/{tid}/resolve", data={"csrf": csrf[1]})
        assert resolved.status_code == 303
        assert live.service.kill.get(tid, time.time()) is None
        # The run repeats itself once more: its flag goes up again before the export is answered.
        assert client.post("/v1/traces", content=protobuf_body(tools[6:]), headers={"Content-Type": "application/x-protobuf"}).status_code == 200
        flag = live.service.kill.get(tid, time.time())
        assert flag is not None and flag["hits"] == 7
        # A trace id no run has: nothing to kill, and no flag left waiting for it.
        nobody = "0123456789abcdef" * 2
        refused = client.post(f"/runs/{nobody}/kill", data={"csrf": csrf[1]})
        assert refused.status_code == 404 and nobody in refused.text
        assert live.service.kill.get(nobody, time.time()) is None
        assert client.post(f"/api/runs/{nobody}/kill").status_code == 404
        assert client.post(f"/runs/{tid}/explode", data={"csrf": csrf[1]}).status_code == 404
        # A name sent in the path shows as text, not as markup.
        shown = client.get("/runs/<img src=x onerror=alert(1)>")
        assert shown.status_code == 404 and "<img" not in shown.text and "&lt;img" in shown.text


def test_a_signed_in_browser_cannot_be_made_to_act_by_another_page(live: Running) -> None:
    import re

    spans = [s for s in loop_spans(2) if s.parent is not None]  # a run still going: its page has a form
    tid = trace_id_of(spans)
    assert httpx.post(f"{live.url}/v1/traces", content=protobuf_body(spans), headers=PB).status_code == 200
    _wait_row(live, tid)
    with httpx.Client(base_url=live.url) as browser_like:
        signed = browser_like.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"]
        # The cookie holds a session id, never the token; HttpOnly, SameSite=Strict, and not
        # Secure over plain HTTP (the browser would not send it back).
        assert TOKEN not in cookie and cookie.startswith("tripwire_session=")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
        # What a page on another port of the same host can make the browser send: the cookie,
        # without the session's CSRF token. Refused, and nothing raised.
        live.service.kill.clear(tid)
        forged = browser_like.post(f"/api/runs/{tid}/kill")
        assert forged.status_code == 403 and "X-CSRF-Token" in forged.text
        assert live.service.kill.get(tid, time.time()) is None
        assert browser_like.post(f"/api/runs/{tid}/kill", headers={"X-CSRF-Token": "0" * 32}).status_code == 403
        # The dashboard's own page knows the token; with it the same call acts.
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', browser_like.get(f"/runs/{tid}").text)
        assert csrf is not None
        acted = browser_like.post(f"/api/runs/{tid}/kill", headers={"X-CSRF-Token": csrf[1]})
        assert acted.status_code == 200
        assert live.service.kill.get(tid, time.time()) is not None
    # An API client with its bearer token needs no CSRF token (no other page can send it).
    assert httpx.post(f"{live.url}/api/runs/{tid}/resolve", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # Behind a TLS proxy that says so, the cookie is Secure.
    proxied = httpx.post(f"{live.url}/login", data={"token": TOKEN}, headers={"X-Forwarded-Proto": "https"}, follow_redirects=False)
    assert "Secure" in proxied.headers["set-cookie"]


def test_every_response_carries_the_security_headers(live: Running) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for path, headers in (("/", auth), ("/login", {}), ("/api/runs", auth), ("/healthz", {}), ("/static/tripwire.css", {}), ("/api/runs", {})):
        got = httpx.get(f"{live.url}{path}", headers=headers)
        assert got.headers["x-frame-options"] == "DENY", path
        assert got.headers["x-content-type-options"] == "nosniff", path
        assert got.headers["referrer-policy"] == "no-referrer", path
        policy = got.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, path


def test_sign_in_is_throttled_per_address(live: Running) -> None:
    for _ in range(10):
        assert httpx.post(f"{live.url}/login", data={"token": "wrong-token-0123456789"}).status_code == 401
    # The 11th try within the minute waits, even with the right token: guessing is slowed to
    # ten tries a minute per address.
    held = httpx.post(f"{live.url}/login", data={"token": TOKEN}, follow_redirects=False)
    assert held.status_code == 429 and 0 < int(held.headers["retry-after"]) <= 60
    # An API client with its token is not affected.
    assert httpx.get(f"{live.url}/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def _wait_row(live: Running, tid: str) -> None:
    """A run that is not stuck is written by the background flush, just after the export's answer."""
    deadline = time.monotonic() + 10
    while live.store.run(tid) is None:
        assert time.monotonic() < deadline, f"run {tid} never written"
        time.sleep(0.05)


def _tool_spans(service: str | None, n: int) -> tuple[Any, ...]:
    """A run still going: ``n`` identical tool spans under a root span that has not ended
    (not sent), from an exporter whose resource is ``service.name=service`` (None: the SDK's
    default, ``unknown_service``)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service} if service else {}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        for i in range(n):
            with tracer.start_as_current_span("execute_tool lookup", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": f"c{i}",
                "gen_ai.tool.call.arguments": json.dumps({"id": i}),
            }):
                pass
    provider.shutdown()
    return tuple(s for s in exporter.get_finished_spans() if s.parent is not None)


def test_a_running_run_is_named_by_its_exporters_service_name_and_an_unnamed_one_by_one_label(live: Running) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    named, unnamed = _tool_spans("billing-bot", 3), _tool_spans(None, 3)
    for spans in (named, unnamed):
        assert httpx.post(f"{live.url}/v1/traces", content=protobuf_body(spans), headers=PB).status_code == 200
        _wait_row(live, trace_id_of(spans))
    runs_page = httpx.get(f"{live.url}/fragments/runs?since=24h", headers=auth).text
    rows = {tid: runs_page.split(f'data-run="{tid}"', 1)[1].split("</tr>", 1)[0] for tid in (trace_id_of(named), trace_id_of(unnamed))}
    # It showed "—" until the root span ended.
    assert "<td>billing-bot</td>" in rows[trace_id_of(named)] and "running" in rows[trace_id_of(named)]
    # The SDK's placeholder service name is no name: the one "no agent" label.
    assert "<td>(no agent)</td>" in rows[trace_id_of(unnamed)] and "unknown_service" not in runs_page
    run_page = httpx.get(f"{live.url}/runs/{trace_id_of(named)}", headers=auth).text
    assert '<th scope="row">agent</th><td>billing-bot</td>' in run_page
    # The Runs page's agent filter knows it from the start.
    filtered = httpx.get(f"{live.url}/fragments/runs?since=24h&agent=billing-bot", headers=auth).text
    assert trace_id_of(named) in filtered and trace_id_of(unnamed) not in filtered


def _buttons(html: str) -> set[str]:
    import re

    return set(re.findall(r'formaction="/runs/[0-9a-f]+/(\w+)"', html))


def test_actions_show_only_where_they_apply_and_the_receipt_reads_as_a_summary(live: Running) -> None:
    import html
    import re

    auth = {"Authorization": f"Bearer {TOKEN}"}
    healthy = _distinct_spans(6)
    assert httpx.post(f"{live.url}/v1/traces", content=protobuf_body(healthy), headers=PB).status_code == 200
    with httpx.Client(base_url=live.url, headers=auth) as client:
        # An ended healthy run: nothing to kill, resolve or acknowledge (all three were shown).
        page = client.get(f"/runs/{trace_id_of(healthy)}").text
        assert _buttons(page) == set() and 'aria-label="Actions on this run"' not in page
        # A looping run still going: the service raised its flag; Resolve and Acknowledge apply.
        spans = loop_spans(6)
        tid = trace_id_of(spans)
        tools = [s for s in spans if s.parent is not None]
        root = [s for s in spans if s.parent is None]
        assert client.post("/v1/traces", content=protobuf_body(tools), headers={"Content-Type": "application/x-protobuf"}).status_code == 200
        page = client.get(f"/runs/{tid}").text
        assert _buttons(page) == {"resolve", "acknowledge"}
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf is not None
        assert client.post(f"/runs/{tid}/resolve", data={"csrf": csrf[1]}).status_code == 303
        assert client.post(f"/runs/{tid}/acknowledge", data={"csrf": csrf[1]}).status_code == 303
        # Flag down, acknowledged, still running: only Kill.
        assert _buttons(client.get(f"/runs/{tid}").text) == {"kill"}
        assert client.post(f"/runs/{tid}/kill", data={"csrf": csrf[1]}).status_code == 303
        assert _buttons(client.get(f"/runs/{tid}").text) == {"resolve"}
        # A run going well, killed by an operator, then ended: its receipt says who stopped it,
        # in words, with the JSON behind a disclosure.
        going = _distinct_spans(4)
        gid = trace_id_of(going)
        pb = {"Content-Type": "application/x-protobuf"}
        assert client.post("/v1/traces", content=protobuf_body([s for s in going if s.parent is not None]), headers=pb).status_code == 200
        _wait_row(live, gid)
        assert _buttons(client.get(f"/runs/{gid}").text) == {"kill"}
        assert client.post(f"/runs/{gid}/kill", data={"csrf": csrf[1]}).status_code == 303
        assert client.post("/v1/traces", content=protobuf_body([s for s in going if s.parent is None]), headers=pb).status_code == 200
        page = client.get(f"/runs/{gid}").text
        summary = page.split('data-field="receipt"', 1)[1].split("</dl>", 1)[0]
        assert "<dt>stop cause</dt><dd>user_cancelled (end: user_abort); killed by token 1 via dashboard at " in summary
        assert "<dt>health</dt><dd>bounded_stop" in summary
        assert "4 tool calls" in summary and "<dt>versions</dt><dd>policy p" in summary
        json_part = page.split('<details id="receipt-json">', 1)[1].split("</details>", 1)[0]
        receipt = json.loads(html.unescape(json_part.split("<code>", 1)[1].split("</code>", 1)[0]))
        assert receipt["condition"]["by"] == "token 1" and receipt["reason"] == "user_cancelled"
        # The stuck run, ended: its own stop cause, in words; the flag still up, so Resolve.
        assert client.post("/v1/traces", content=protobuf_body(root), headers=pb).status_code == 200
        page = client.get(f"/runs/{tid}").text
        assert "<dt>stop cause</dt><dd>loop_detected (end: stop_condition); call_index 6" in page


def _pattern_spans(queries: str) -> tuple[Any, ...]:
    """A run still going: one tool span per letter of ``queries``, the letter its argument."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        for i, q in enumerate(queries):
            with tracer.start_as_current_span("execute_tool fetch_page", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fetch_page", "gen_ai.tool.call.id": f"p{i}",
                "gen_ai.tool.call.arguments": json.dumps({"page": q}),
            }):
                pass
    provider.shutdown()
    return tuple(s for s in exporter.get_finished_spans() if s.parent is not None)


def _no_sideways_scroll(page: Any) -> None:
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth"), page.url


def test_the_loop_is_drawn_one_coloured_cell_per_call_and_no_page_scrolls_sideways_at_390px(browser: Any, live: Running) -> None:
    looping = [s for s in loop_spans(6) if s.parent is not None]
    cycling = _pattern_spans("xyxyxyxy")
    for spans in (looping, cycling):
        assert httpx.post(f"{live.url}/v1/traces", content=protobuf_body(spans), headers=PB).status_code == 200
    page = _page(browser, live)
    page.goto(f"{live.url}/runs/{trace_id_of(looping)}")
    cells = page.locator("ol.strip li")
    assert cells.count() == 6
    classes = {c.get_attribute("class").replace(" changed", "") for c in cells.all()}
    assert len(classes) == 1 and classes.pop().startswith("cell sig-")  # one signature, one colour
    assert [c.locator(".letter").inner_text() for c in cells.all()] == ["A"] * 6
    assert "search_docs" in (cells.first.get_attribute("title") or "")
    # The verdict changed at the call the service judged stuck: that cell is marked.
    (changed,) = page.locator("ol.strip li.changed").all()
    assert "verdict: stuck (repetition)" in (changed.get_attribute("title") or "")
    page.screenshot(path=str(ARTIFACTS / "dashboard-run-loop-strip.png"), full_page=True)
    page.goto(f"{live.url}/runs/{trace_id_of(cycling)}")
    cells = page.locator("ol.strip li")
    letters = [c.locator(".letter").inner_text() for c in cells.all()]
    assert letters == ["A", "B"] * 4  # A-B-A-B readable at a glance
    colour = [c.get_attribute("class").split()[1] for c in cells.all()]
    assert colour[0::2] == [colour[0]] * 4 and colour[1::2] == [colour[1]] * 4
    assert colour[0] != colour[1]  # two signatures, two colours (by digest, they once shared one)
    page.screenshot(path=str(ARTIFACTS / "dashboard-run-cycle-strip.png"), full_page=True)
    # At 390 px every page fits: tables scroll in their own box.
    page.set_viewport_size({"width": 390, "height": 844})
    for path in ("/", "/runs?since=24h", f"/runs/{trace_id_of(looping)}"):
        page.goto(f"{live.url}{path}")
        _no_sideways_scroll(page)
        page.screenshot(path=str(ARTIFACTS / f"dashboard-390px{path.replace('/', '-').split('?')[0] or '-fleet'}.png"), full_page=True)


def test_a_looping_agent_appears_in_stuck_now_and_is_killed_and_acknowledged_from_the_fleet_page(browser: Any, live: Running) -> None:
    page = _page(browser, live)
    assert "No run is stuck right now." in page.locator("[data-stuck-now]").inner_text()
    hours = page.locator("svg.chart text.hour")
    now = time.time()
    start = now - now % 3600 - 23 * 3600
    assert hours.count() == 8  # the chart had no time axis (y labels 0 and 1 only)
    assert hours.first.text_content() == time.strftime("%H:00", time.gmtime(start))
    spans = [s for s in loop_spans(6, agent="looper") if s.parent is not None]
    tid = trace_id_of(spans)
    started = time.monotonic()
    assert httpx.post(f"{live.url}/v1/traces", content=protobuf_body(spans), headers=PB).status_code == 200
    row = page.locator(f'[data-stuck-now] tr[data-run="{tid}"]')
    row.wait_for(timeout=10_000)  # the page refreshes itself: no reload
    assert time.monotonic() - started < 10
    cells = row.locator("td").all_inner_texts()
    assert cells[2] == "search_docs" and cells[3] == "repetition" and cells[4] == "2"  # stuck at the 4th of 6 calls
    assert "flag up" in cells[7]  # the service raised it; an operator lowers it through the API...
    assert httpx.post(f"{live.url}/api/runs/{tid}/resolve", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # ...and kills it again from the Fleet page, in place.
    row.get_by_role("button", name="Kill").click(timeout=10_000)
    page.wait_for_url(f"{live.url}/?done=*")
    assert "Kill flag raised" in page.get_by_role("status").inner_text()
    flag = live.service.kill.get(tid, time.time())
    assert flag is not None and flag["by"] == "operator"
    page.locator(f'[data-stuck-now] tr[data-run="{tid}"]').get_by_role("button", name="Acknowledge").click()
    page.wait_for_url(f"{live.url}/?done=*")
    assert "Acknowledged" in page.get_by_role("status").inner_text()
    assert live.store.run(tid).acknowledged  # type: ignore[union-attr]
    assert page.locator(f'[data-stuck-now] tr[data-run="{tid}"]').get_by_role("button").count() == 0
    page.screenshot(path=str(ARTIFACTS / "dashboard-fleet-stuck-now.png"), full_page=True)
