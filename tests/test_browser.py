"""The lab's pages in a real browser: headless Chromium opens each from file:// with the network
off, a test picks a layer and a head, hovers a query token and reads what the page shows: every
key's weight to three decimals, as the arrays hold them, and no error in the console. A
screenshot of each is written beside the page.

Needs Debian's chromium and chromium-driver (`apt-get install chromium chromium-driver`; .ci/run
installs them where it can) and selenium (requirements-test.txt); without them it skips, saying
which is missing. Slow: a browser start is about 1.5 s a page."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_serve import chat_server  # noqa: F401 (a fixture)
from test_views import random_maps

from jaxgpt.lab.views import attention_view, embedded_data, logit_lens_view, patching_view

pytestmark = pytest.mark.slow
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def start_browser(offline: bool):
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed: pip install -r requirements-test.txt"
    )
    if not (CHROMIUM and DRIVER):
        pytest.skip("no headless browser here: apt-get install chromium chromium-driver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    if offline:  # the lab's pages are files that must need nothing from a network
        driver.execute_cdp_cmd("Network.enable", {})
        conditions = {"offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0}
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", conditions)
    return driver


@pytest.fixture(scope="module")
def browser():
    driver = start_browser(offline=True)
    yield driver
    driver.quit()


def shown_weights(browser, page: Path, layer: int, head: int, query: int) -> list[float]:
    """Open `page`, choose the layer and the head, hover the query: the keys' weights as shown."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    browser.get(page.as_uri())
    browser.find_elements(By.CSS_SELECTOR, "#layers button")[layer].click()
    browser.find_elements(By.CSS_SELECTOR, "#heads button")[head].click()
    ActionChains(browser).move_to_element(browser.find_elements(By.CSS_SELECTOR, "#queries .token")[query]).perform()
    titles = [float(key.get_attribute("title")) for key in browser.find_elements(By.CSS_SELECTOR, "#keys .token")]
    listed = browser.find_element(By.ID, "readout").text.split(":\n", 1)[1]
    assert [float(w) for w in re.findall(r"\d\.\d{3}\b", listed)] == titles  # the list and the shading agree
    return titles


def console_errors(browser) -> list[str]:
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.mark.parametrize("queries, keys", [(list("if x:"), None), (list("abc"), list("uvwxyz"))], ids=["self", "cross"])
def test_hovering_a_query_shows_its_weight_on_every_key(browser, tmp_path, queries, keys):
    maps = random_maps(layers=2, heads=3, t=len(queries), s=len(keys or queries), seed=1)
    page = attention_view(maps, queries, keys, title="weights").save(tmp_path / "attention.html")
    for layer, head, query in ((1, 2, len(queries) - 1), (0, 1, 1)):
        shown = shown_weights(browser, page, layer, head, query)
        # embedded to four decimals, shown to three: at most 0.5e-4 + 0.5e-3 from the weight
        np.testing.assert_allclose(shown, maps[layer, head, query], rtol=0, atol=0.55e-3)
    assert console_errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "attention.png")) and (tmp_path / "attention.png").stat().st_size


def test_hovering_a_lens_cell_lists_that_layers_guesses(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    logits = np.random.default_rng(2).normal(size=(3, 4, 12)) * 3
    page = logit_lens_view(logits, np.array([1, 4, 2, 9]), lambda t: "abcdefghijkl"[t[0]], title="lens")
    path = page.save(tmp_path / "lens.html")
    data = embedded_data(page)
    browser.get(path.as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "#lens tr")
    assert [row.find_element(By.TAG_NAME, "th").text for row in rows[1:]] == ["embed", "block 0", "block 1"]
    for layer, position in ((1, 2), (0, 0)):
        cell = rows[1 + layer].find_elements(By.CSS_SELECTOR, "td")[position]
        ActionChains(browser).move_to_element(cell).perform()
        want = data["cells"][layer][position]
        assert cell.text == want["top"][0][0] and float(cell.get_attribute("title")) == round(want["top"][0][1], 3)
        guesses, following = browser.find_element(By.ID, "readout").text.split("\n")[1:]
        assert [float(p) for p in re.findall(r"\d\.\d{3}\b", guesses)] == [round(p, 3) for _, p in want["top"]]
        assert float(following.rsplit(": ", 1)[1]) == round(want["next"], 3)
    assert console_errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "lens.png"))


def test_hovering_a_patching_cell_shows_what_it_restores(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    tables = {
        "resid_pre": np.random.default_rng(5).normal(size=(2, 4)),
        "head_out": np.random.default_rng(6).normal(size=(2, 3)),
    }
    labels = {"resid_pre": list("abcd"), "head_out": ["head 0", "head 1", "head 2"]}
    path = patching_view(tables, labels, title="patching", note="clean 1, corrupted 0").save(tmp_path / "patching.html")
    browser.get(path.as_uri())
    assert browser.find_element(By.ID, "note").text == "clean 1, corrupted 0"
    for name, layer, column in (("resid_pre", 1, 2), ("head_out", 0, 1)):
        cell = browser.find_element(By.CSS_SELECTOR, f'td[data-cell="{list(tables).index(name)},{layer},{column}"]')
        ActionChains(browser).move_to_element(cell).perform()
        readout = browser.find_element(By.ID, "readout").text
        assert readout.startswith(f"{name}, layer {layer}, ")
        # embedded to four decimals, shown to three: at most 0.5e-4 + 0.5e-3 from the value
        assert float(readout.rsplit("restored ", 1)[1]) == pytest.approx(tables[name][layer, column], abs=0.55e-3)
        assert "on" in cell.get_attribute("class").split()
    assert console_errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "patching.png"))


def test_each_page_shows_its_key_and_a_space_as_a_mark(browser, tmp_path):
    """What the shading means, on what scale, in every view; a guess of a space (an empty cell
    before) reads ␣."""
    from selenium.webdriver.common.by import By

    logits = np.zeros((2, 3, 4))
    logits[:, :, 0] = 5.0  # every cell's top guess: token 0, a space
    pages = {
        "attention": attention_view(random_maps(1, 1, 3, 3, seed=0), list("a b"), title="weights"),
        "lens": logit_lens_view(logits, np.array([1, 2, 3]), lambda t: " xyz"[t[0]], title="lens"),
        "patching": patching_view({"resid_pre": np.ones((1, 2))}, {"resid_pre": list("ab")}, title="p", note="n"),
    }
    for name, page in pages.items():
        browser.get(page.save(tmp_path / f"{name}.html").as_uri())
        key = browser.find_element(By.CSS_SELECTOR, ".legend")
        assert key.is_displayed() and re.search(r"0 .*1", key.text) and "␣ is a space" in key.text, (name, key.text)
    browser.get((tmp_path / "lens.html").as_uri())
    assert {cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#lens td")} == {"␣"}
    assert console_errors(browser) == []


def test_the_timeline_slider_shows_each_steps_patterns_and_a_chart_its_values(browser, tmp_path):
    """The timeline page (jaxgpt/lab/timeline.py) from records of two steps: the slider at each
    step draws that step's pattern of each head, hovering the loss chart lists the nearest step's
    values, and nothing is fetched or fails."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from jaxgpt.lab.timeline import timeline_data, timeline_view

    maps = [random_maps(layers=2, heads=2, t=3, s=3, seed=seed).tolist() for seed in (3, 4)]
    records = [
        {"step": step, "train_loss": loss, "val_loss": loss + 0.1, "lab_induction": [[0.1, 0.2], [0.3, 0.4 + i]],
         "lab_pattern": maps[i], "lab_pattern_tokens": [0, 1, 2]}
        for i, (step, loss) in enumerate(((10, 3.0), (20, 2.0)))
    ]  # fmt: skip
    page = timeline_view(timeline_data(records, lambda ids: ["a", "b", "c"]), title="timeline")
    path = page.save(tmp_path / "timeline.html")
    browser.get(path.as_uri())
    slider = browser.find_element(By.ID, "step")
    for i in (1, 0):
        browser.execute_script(
            "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))", slider, i
        )
        assert browser.find_element(By.ID, "stepname").text == str(records[i]["step"])
        canvases = browser.find_elements(By.CSS_SELECTOR, "#patterns canvas")
        shown = [json.loads(c.get_attribute("data-weights")) for c in canvases]
        np.testing.assert_allclose(shown, np.asarray(maps[i]).reshape(4, 3, 3), rtol=1e-12)  # as recorded
    chart = browser.find_element(By.ID, "loss")
    ActionChains(browser).move_to_element_with_offset(chart, 440, 0).perform()  # the right half: step 20
    assert browser.find_element(By.ID, "readout").text == "train loss at step 20: 2.0000\nval loss at step 20: 2.1000"
    assert browser.find_element(By.ID, "probe").text == "probe: abc"
    assert console_errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "timeline.png"))


def test_the_servers_chat_page_streams_an_answer_and_keeps_the_conversation(chat_server, tmp_path):  # noqa: F811
    """jaxgpt serve's page (/) in Chromium, against a chat run served with an API key: type a
    message and press Enter; the answer streams into the page and equals what the API answers
    the same conversation greedily; a second turn sends both turns (its answer is the API's for
    the whole conversation); no error in the console."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
    from test_serve import post

    url, _, _, _ = chat_server
    driver = start_browser(offline=False)
    try:
        driver.get(url + "/")
        WebDriverWait(driver, 20).until(lambda d: "tiny-chat" in d.find_element(By.ID, "model").text)
        driver.find_element(By.TAG_NAME, "summary").click()
        for field, value in (("temperature", "0"), ("max_tokens", "10"), ("key", "sesame")):
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        history = []
        for turn, message in enumerate(["What is 1 + 2?", "And 3 + 4?"]):
            driver.find_element(By.ID, "message").send_keys(message, Keys.ENTER)
            done = f"#log .assistant:nth-of-type({2 * turn + 2})"
            WebDriverWait(driver, 30).until(
                lambda d, done=done: (
                    d.find_elements(By.CSS_SELECTOR, done)
                    and d.find_element(By.CSS_SELECTOR, done).get_attribute("data-done") == "true"
                )
            )
            shown = driver.execute_script(f"return document.querySelector('{done}').textContent")
            history.append({"role": "user", "content": message})
            asked = {"messages": history, "temperature": 0, "max_tokens": 10}
            expected = post(url, "/v1/chat/completions", asked).json()["choices"][0]["message"]["content"]
            assert shown == expected, turn
            history.append({"role": "assistant", "content": expected})
        assert console_errors(driver) == []
        assert driver.save_screenshot(str(tmp_path / "chat.png"))
    finally:
        driver.quit()
