"""The chat page at GET /, in a real browser (headless chromium through Selenium) against
the real server: SmolLM2 with the test projector (images), and Gemma 3 270M beside it.

Asserted: no console errors (CSP violations included), an answer sent with Enter streams
in, stop mid-stream frees the sequence, regenerate and edit-and-resend, switching model,
image attach, conversations (rename, delete) surviving a reload. Screenshots (light and
dark, desktop and phone width) go to tests/screenshots/. Never the words a model picks.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server, write_test_projector
from PIL import Image

from edge_testkit.browser import (
    DESKTOP,
    PHONE,
    browser,
    console_errors,
    open_page,
    screenshot,
    set_viewport,
    wait_for,
)
from edge_testkit.models.gemma import GEMMA_TEMPLATE, gemma_gguf

GEMMA = "gemma3-270m"
# The state of answer number `count`: its state, text length, stats line and failure.
ANSWER_STATE = """
const last = document.querySelectorAll(".msg.assistant")[arguments[0] - 1];
if (!last) return null;
return {state: last.dataset.state, length: last.querySelector(".body").textContent.length,
        stats: last.querySelector(".stats")?.textContent || "",
        failure: last.querySelector(".failure")?.textContent || ""};
"""


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("webui")
    gguf = gemma_gguf(tmp)
    registry = tmp / "registry.toml"
    registry.write_text(
        f'[[models]]\nid = "{GEMMA}"\npath = "{gguf}"\nctx_size = 2048\n'
        f'chat_template_file = "{GEMMA_TEMPLATE}"\n')
    projector = write_test_projector(tmp / "test-mmproj.gguf")
    server = start_server(tmp, "--registry", str(registry), "--mmproj", str(projector),
                          "--parallel", "2", "--ctx-size", "4096", name="webui")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text(), server.log_text()


@pytest.fixture(scope="module")
def page(chat_server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with browser(tmp_path_factory) as driver:
        open_page(driver, chat_server.base_url + "/")
        yield driver


def by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def set_setting(driver: Any, element_id: str, value: str) -> None:
    if not by_id(driver, "settings").is_displayed():
        by_id(driver, "settings-toggle").click()
    field = by_id(driver, element_id)
    # Emptied as a user's delete would (an input event), then typed into.
    driver.execute_script("arguments[0].value = '';"
                          "arguments[0].dispatchEvent(new Event('input'))", field)
    field.send_keys(value)
    assert driver.execute_script("return arguments[0].value", field) == value
    by_id(driver, "settings-toggle").click()


def answers(driver: Any) -> int:
    return int(driver.execute_script("return document.querySelectorAll('.msg.assistant').length"))


def send(driver: Any, text: str) -> int:
    """Types `text` and presses Enter; the number of the answer that will follow."""
    from selenium.webdriver.common.keys import Keys

    count = answers(driver) + 1
    wait_for(lambda: by_id(driver, "prompt").is_enabled(), 120, "the composer")
    by_id(driver, "prompt").send_keys(text, Keys.ENTER)
    return count


def follow(driver: Any, count: int, timeout: float = 300.0) -> dict[str, Any]:
    """Watches answer number `count` until it leaves "streaming": its final state, stats
    line and failure, and `seen`, the lengths its text went through while it streamed."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = driver.execute_script(ANSWER_STATE, count)
        if now is not None and now["state"] != "streaming":
            return {**now, "seen": seen}
        if now is not None and (not seen or seen[-1] != now["length"]):
            seen.append(now["length"])
        time.sleep(0.01)
    raise AssertionError(f"answer {count} still streaming after {timeout} s")


def stored(driver: Any) -> dict[str, Any]:
    """The current conversation as the page keeps it in localStorage."""
    conversations = json.loads(driver.execute_script(
        "return localStorage.getItem('edge-chat.conversations')"))
    current = json.loads(driver.execute_script("return localStorage.getItem('edge-chat.current')"))
    return next(c for c in conversations if c["id"] == current)


def pick_model(driver: Any, model: str) -> None:
    from selenium.webdriver.support.select import Select

    Select(by_id(driver, "model-picker")).select_by_value(model)


def figure(pattern: str, stats: str) -> int:
    """A number of an answer's stats line."""
    found = re.search(pattern, stats)
    assert found, (pattern, stats)
    return int(found.group(1))


def health(server: RunningServer, model: str = DEFAULT_MODEL) -> dict[str, int]:
    return httpx.get(f"{server.base_url}/health").json()["models"][model]


def test_page_loads_without_console_errors(page: Any, chat_server: RunningServer) -> None:
    assert page.title == "edge_server chat"
    assert console_errors(page) == []
    options = page.execute_script(
        "return [...document.querySelectorAll('#model-picker option')].map(o => o.value)")
    assert options[0] == DEFAULT_MODEL and GEMMA in options
    # The default model has the projector: images may be attached.
    assert by_id(page, "attach-label").is_displayed()


def test_a_message_sent_with_enter_streams_in(page: Any) -> None:
    set_setting(page, "max-tokens", "40")
    set_setting(page, "temperature", "0")
    result = follow(page, send(page, "Tell me about the sea."))
    assert result["state"] == "done", result
    assert len(set(result["seen"])) >= 3, result  # the text came in step by step
    stats = result["stats"]
    tokens = figure(r"(\d+) tokens", stats)
    assert 1 <= tokens <= 40
    assert re.search(r"[\d.]+ tok/s", stats) and "first token" in stats
    assert re.search(r"\d+ of \d+ prompt tokens cached", stats)
    conversation = stored(page)
    assert [m["role"] for m in conversation["messages"]] == ["user", "assistant"]
    assert conversation["title"] == "Tell me about the sea."


def test_stop_mid_stream_frees_the_sequence(page: Any, chat_server: RunningServer) -> None:
    # A schema that asks for 200 numbers: the answer cannot end before it is stopped.
    set_setting(page, "json-schema", json.dumps(
        {"type": "array", "items": {"type": "integer"}, "minItems": 200}))
    set_setting(page, "max-tokens", "1000")
    try:
        count = send(page, "List numbers.")
        wait_for(lambda: page.execute_script(
            "const a = document.querySelectorAll('.msg.assistant');"
            f"return a[{count - 1}]?.querySelector('.body').textContent.length > 0"), 120,
            "the answer to begin")
    finally:
        # Also when the test failed: the next tests need the composer back.
        page.execute_script("document.getElementById('stop').click()")
        set_setting(page, "json-schema", "")
        set_setting(page, "max-tokens", "24")
    result = follow(page, count)
    assert result["state"] == "stopped" and "stopped" in result["stats"]
    answer = stored(page)["messages"][-1]
    assert answer["content"].lstrip().startswith("[")  # the schema's grammar held
    wait_for(lambda: health(chat_server)["busy_sequences"] == 0, 30, "the sequence to end")
    assert by_id(page, "send").is_displayed() and not by_id(page, "stop").is_displayed()
    settings = json.loads(page.execute_script("return localStorage.getItem('edge-chat.settings')"))
    assert settings["json_schema"] == "" and settings["max_tokens"] == "24"


def test_regenerate_and_edit_and_resend(page: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    before = len(stored(page)["messages"])
    count = answers(page)
    page.find_elements(By.XPATH, "//article[contains(@class,'assistant')]"
                                 "//button[text()='Regenerate']")[-1].click()
    assert follow(page, count)["state"] == "done"
    assert len(stored(page)["messages"]) == before  # the last answer was replaced
    page.find_elements(By.XPATH, "//article[contains(@class,'user')]"
                                 "//button[text()='Edit']")[0].click()
    box = page.find_element(By.CSS_SELECTOR, ".edit-box")
    box.clear()
    box.send_keys("Tell me about rivers.", Keys.ENTER)
    assert follow(page, 1)["state"] == "done"
    messages = stored(page)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == "Tell me about rivers."


def test_switching_model(page: Any, chat_server: RunningServer) -> None:
    by_id(page, "new-chat").click()
    pick_model(page, GEMMA)
    assert not by_id(page, "attach-label").is_displayed()  # Gemma here has no projector
    result = follow(page, send(page, "Say hello."))
    assert result["state"] == "done", result
    assert page.execute_script(
        "return [...document.querySelectorAll('.msg.assistant .role')].pop().textContent"
    ) == GEMMA
    assert stored(page)["model"] == GEMMA
    cards = httpx.get(f"{chat_server.v1}/models").json()["data"]
    assert next(c for c in cards if c["id"] == GEMMA)["status"] == "loaded"
    wait_for(lambda: "(loaded" in page.execute_script(
        f"return document.querySelector('#model-picker option[value=\"{GEMMA}\"]').textContent"),
        10, "the picker to show Gemma loaded")


def test_image_attach(page: Any, chat_server: RunningServer, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    by_id(page, "new-chat").click()
    pick_model(page, DEFAULT_MODEL)
    picture = tmp_path / "picture.png"
    pixels = np.random.default_rng(7).integers(0, 255, (40, 48, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    picture.write_bytes(buffer.getvalue())
    encoded = health(chat_server).get("images_encoded", 0)
    page.execute_script("arguments[0].style.display = 'block'", by_id(page, "attach"))
    by_id(page, "attach").send_keys(str(picture))
    wait_for(lambda: page.find_elements(By.CSS_SELECTOR, "#attachments img"), 10, "the preview")
    result = follow(page, send(page, "What is in the picture?"))
    assert result["state"] == "done" and not result["failure"], result
    prompt_tokens = figure(r"of (\d+) prompt", result["stats"])
    assert prompt_tokens > 16  # the test projector's 16 image tokens, plus the text
    assert health(chat_server)["images_encoded"] == encoded + 1
    user = stored(page)["messages"][0]
    assert user["images"][0].startswith("data:image/png;base64,")
    assert page.find_elements(By.CSS_SELECTOR, ".msg.user .images img")
    assert not page.find_elements(By.CSS_SELECTOR, "#attachments img")


def test_reload_keeps_conversations_renamed_and_deleted(page: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def titles() -> list[str]:
        return [e.text for e in page.find_elements(By.CSS_SELECTOR, "#conversations .title")]

    def shown_messages() -> list[str]:
        return [e.text for e in page.find_elements(By.CSS_SELECTOR, ".msg .body")]

    before_titles, before_messages = titles(), shown_messages()
    assert len(before_titles) == 3 and len(before_messages) == 2
    open_page(page, page.current_url)
    assert titles() == before_titles and shown_messages() == before_messages
    page.find_elements(By.CSS_SELECTOR, "#conversations .rename")[0].click()
    field = page.find_element(By.CSS_SELECTOR, "#conversations input")
    field.send_keys("Renamed chat", Keys.ENTER)  # the old title is selected: typed over
    page.find_elements(By.CSS_SELECTOR, "#conversations .delete")[1].click()
    page.switch_to.alert.accept()
    open_page(page, page.current_url)
    assert titles() == ["Renamed chat", before_titles[2]]


def test_screenshots_light_and_dark_desktop_and_phone(page: Any) -> None:
    from selenium.webdriver.common.by import By

    by_id(page, "new-chat").click()
    set_setting(page, "max-tokens", "96")
    follow(page, send(page, "Write a Python function that adds two numbers, in a code block."))
    for theme in ("light", "dark"):
        set_viewport(page, DESKTOP, mobile=False)
        if page.execute_script("return document.documentElement.dataset.theme") != theme:
            by_id(page, "theme-toggle").click()
        assert screenshot(page, f"desktop-{theme}").stat().st_size > 10_000
        set_viewport(page, PHONE, mobile=True)
        wait_for(lambda: page.execute_script(  # the conversation list slides away
            "return document.getElementById('sidebar').getBoundingClientRect().right <= 0"),
            5, "the conversation list to hide at phone width")
        assert screenshot(page, f"phone-{theme}").stat().st_size > 5_000
    by_id(page, "menu-toggle").click()
    wait_for(lambda: page.execute_script(
        "return document.getElementById('sidebar').getBoundingClientRect().left >= 0"), 5,
        "the conversation list to slide in")
    screenshot(page, "phone-dark-conversations")
    page.find_element(By.CSS_SELECTOR, "#conversations .title").click()
    set_viewport(page, DESKTOP, mobile=False)
    assert console_errors(page) == []


def test_markdown_code_copy_folded_reasoning_and_sanitizing(page: Any) -> None:
    """An answer as the page stores it (a model that thinks, and text that tries to run
    script) is rendered: Markdown, a copy button on code, the reasoning folded away, and
    nothing of the model's HTML able to run or to load anything."""
    from selenium.webdriver.common.by import By

    hostile = ('<img src=x onerror="window.hacked=1"><script>window.hacked=2</script>'
               '[link](javascript:window.hacked=3) <a href="#" style="color:red">styled</a>')
    conversation = {
        "id": "rendering", "title": "Rendering", "titled": True, "model": DEFAULT_MODEL,
        "system": "", "updated": 0, "messages": [
            {"role": "user", "content": "<b>not bold</b>"},
            {"role": "assistant", "model": DEFAULT_MODEL, "state": "done",
             "reasoning": "Let me think.",
             "content": f"Some **bold** text.\n\n```python\nprint('hi')\n```\n\n{hostile}"}]}
    page.execute_script(
        "const all = JSON.parse(localStorage.getItem('edge-chat.conversations')) || [];"
        "all.unshift(arguments[0]);"
        "localStorage.setItem('edge-chat.conversations', JSON.stringify(all));"
        "localStorage.setItem('edge-chat.current', JSON.stringify(arguments[0].id));",
        conversation)
    open_page(page, page.current_url)
    answer = page.find_element(By.CSS_SELECTOR, ".msg.assistant")
    assert answer.find_element(By.CSS_SELECTOR, ".body strong").text == "bold"
    code = answer.find_element(By.CSS_SELECTOR, "pre code")
    assert code.get_attribute("textContent") == "print('hi')\n"
    assert answer.find_element(By.CSS_SELECTOR, "pre button.copy").is_displayed()
    details = answer.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert details.get_attribute("open") is None  # folded
    assert details.find_element(By.TAG_NAME, "summary").text == "Reasoning"
    assert not details.find_element(By.TAG_NAME, "div").is_displayed()
    details.find_element(By.TAG_NAME, "summary").click()
    assert details.find_element(By.TAG_NAME, "div").text == "Let me think."
    user = page.find_element(By.CSS_SELECTOR, ".msg.user .body")
    assert user.text == "<b>not bold</b>"  # a user's text is text
    body = answer.find_element(By.CSS_SELECTOR, ".body")
    assert not body.find_elements(By.CSS_SELECTOR, "img, script, [style]")
    assert "<script>window.hacked=2</script>" in body.text  # shown, as text
    assert all(not (a.get_attribute("href") or "").startswith("javascript:")
               for a in body.find_elements(By.TAG_NAME, "a"))
    assert page.execute_script("return window.hacked") is None
    errors = console_errors(page)
    assert errors == [], '\n'.join(errors)
