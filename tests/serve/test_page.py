"""GET / (the chat page): self-contained, public, and it streams an answer in headless chromium."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.serve.conftest import API_KEY


def test_page_is_public_and_self_contained(live):
    r = httpx.get(live.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "<script>" in html and "/v1/chat/completions" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from elsewhere
    assert "localStorage" not in html and "cookie" not in html  # the key stays in the page's memory
    assert httpx.get(live.url + "/v1/models").status_code == 401  # the API itself still needs the key


def test_a_message_typed_in_chromium_streams_its_answer(live):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.report.browser import start_chromium

    web = start_chromium(1000, 800)
    try:
        web.get(live.url + "/")
        wait = WebDriverWait(web, 60)
        wait.until(lambda d: d.find_element(By.ID, "keybox").is_displayed())  # the page asks for the key
        web.find_element(By.ID, "key").send_keys(API_KEY)
        web.find_element(By.ID, "max_tokens").clear()
        web.find_element(By.ID, "max_tokens").send_keys("12")
        web.find_element(By.ID, "temperature").clear()
        web.find_element(By.ID, "temperature").send_keys("0")
        web.find_element(By.ID, "input").send_keys("Hi 你好 👍🏽")
        web.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_element(By.ID, "send").is_enabled()
                   and len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 1)
        user = web.find_element(By.CSS_SELECTOR, ".msg.user").text
        answer = web.execute_script("return document.querySelector('.msg.assistant').textContent")
        assert user == "Hi 你好 👍🏽"
        assert not web.find_elements(By.CSS_SELECTOR, ".msg.error"), answer
        import openai

        client = openai.OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0)
        ref = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi 你好 👍🏽"}],
                                             max_tokens=12, temperature=0).choices[0].message.content
        assert answer == ref and answer
        assert API_KEY not in web.execute_script("return JSON.stringify(localStorage) + document.cookie")
    finally:
        web.quit()
