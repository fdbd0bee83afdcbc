"""Drives the management web UI in headless Chromium through WebDriver, against a running
Sluice that carries real AMQP traffic from pika, and checks what a person would see.

Run by interop/ui/check, which starts the broker and installs what this needs.
"""
import argparse
import base64
import json
import os
import sys
import threading
import time
import urllib.request

import pika
import pika.exceptions
from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

# The longest wait for something to show: pages refresh every 5 s and the rates chart needs
# two samples of a rate that the broker itself samples every 5 s.
WAIT_S = 30
WORK_QUEUE = "ui-check.work"  # the publisher's messages, taken by the consumer
HELD_QUEUE = "ui-check.held"  # messages that stay, for the queue page
HELD_COUNT = 3
CONSUMER_NAME = "ui-check consumer"
CLOSE_REASON = "closed from the UI check"
PLAIN_USER = "ui-check-plain"  # a user with no tags, whom the API refuses
# Markup in the payload: shown as text, it proves the page escapes what it shows.
PAYLOAD = "hello from the browser <b id='injected'>not markup</b>"
# The chart's series colours as RGB: publish (#1f6feb), deliver/get (#12b76a), ack (#f79009).
SERIES_RGB = [(31, 111, 235), (18, 183, 106), (247, 144, 9)]


class Traffic:
    """A publisher and a consumer on WORK_QUEUE, each a pika connection on its own thread."""

    def __init__(self, port):
        self.port = port
        self.stop = threading.Event()
        self.consuming = threading.Event()
        self.consumer_closed = None  # (reply code, reply text) once the broker closed it
        self.errors = []
        self.published = 0
        self.consumed = 0
        self.threads = [
            threading.Thread(target=self._guard, args=(self._publish,), daemon=True),
            threading.Thread(target=self._guard, args=(self._consume,), daemon=True),
        ]

    def parameters(self, name):
        return pika.ConnectionParameters(
            host="127.0.0.1",
            port=self.port,
            credentials=pika.PlainCredentials("guest", "guest"),
            client_properties={"connection_name": name},
        )

    def start(self):
        for thread in self.threads:
            thread.start()
        if not self.consuming.wait(10):
            raise AssertionError(f"the pika consumer did not start: {self.errors}")

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(5)

    def _guard(self, body):
        try:
            body()
        except Exception as error:  # reported by the checks that need the thread
            self.errors.append(repr(error))

    def _publish(self):
        connection = pika.BlockingConnection(self.parameters("ui-check publisher"))
        channel = connection.channel()
        while not self.stop.is_set():
            channel.basic_publish("", WORK_QUEUE, b"work")
            self.published += 1
            connection.process_data_events(time_limit=0.02)  # about 50 messages a second
        connection.close()

    def _consume(self):
        connection = pika.BlockingConnection(self.parameters(CONSUMER_NAME))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=20)

        def on_message(ch, method, _properties, _body):
            ch.basic_ack(method.delivery_tag)
            self.consumed += 1

        channel.basic_consume(WORK_QUEUE, on_message)
        self.consuming.set()
        try:
            while not self.stop.is_set():
                connection.process_data_events(time_limit=0.2)
        except pika.exceptions.ConnectionClosedByBroker as closed:
            self.consumer_closed = (closed.reply_code, closed.reply_text)
            return
        connection.close()


class Api:
    """The management API, as guest, to check what the UI did."""

    def __init__(self, base):
        self.base = base
        token = base64.b64encode(b"guest:guest").decode()
        self.headers = {"Authorization": f"Basic {token}"}

    def get(self, path):
        request = urllib.request.Request(self.base + "/api" + path, headers=self.headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def put(self, path, body):
        headers = dict(self.headers, **{"Content-Type": "application/json"})
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.base + "/api" + path, data, headers, method="PUT")
        with urllib.request.urlopen(request, timeout=10):
            pass


def wait_for(description, probe, timeout=WAIT_S):
    """Polls probe() until it answers something true; answers that, or fails saying what."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except (NoSuchElementException, StaleElementReferenceException) as error:
            last = type(error).__name__
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {description} (last seen: {last!r})")
        time.sleep(0.2)


def text_of(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def accept_confirm(driver):
    def accepted():
        try:
            driver.switch_to.alert.accept()
            return True
        except NoAlertPresentException:
            return False

    wait_for("the confirmation dialog", accepted, timeout=5)


def table_cell(driver, container_id, row_text, column):
    """The text of `column` in the first row of the table in container_id that contains row_text."""
    table = driver.find_element(By.CSS_SELECTOR, f"#{container_id} table")
    headers = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    for row in table.find_elements(By.CSS_SELECTOR, "tbody tr"):
        if row_text in row.text:
            cells = row.find_elements(By.TAG_NAME, "td")
            return cells[headers.index(column)].text
    return None


class Checks:
    def __init__(self, driver, base, api, traffic, screenshots):
        self.driver = driver
        self.base = base
        self.api = api
        self.traffic = traffic
        self.screenshots = screenshots
        self.passed = 0
        self.failed = 0

    def run(self, name, check):
        """Runs one check; answers whether it passed, printing what failed."""
        started = time.monotonic()
        try:
            check()
        except Exception as error:  # any failure of a check is reported, not raised
            self.failed += 1
            print(f"FAIL {name}: {error}", flush=True)
            self._report_page(name)
            return False
        self.passed += 1
        print(f"PASS {name} ({time.monotonic() - started:.1f} s)", flush=True)
        return True

    def _report_page(self, name):
        try:
            body = self.driver.find_element(By.TAG_NAME, "body").text
            print(f"     page {self.driver.current_url}:\n       " + body[:1500].replace("\n", "\n       "))
            if self.screenshots:
                os.makedirs(self.screenshots, exist_ok=True)
                slug = "".join(c if c.isalnum() else "-" for c in name)
                self.driver.save_screenshot(os.path.join(self.screenshots, f"{slug}.png"))
        except WebDriverException as error:
            print(f"     (could not read the page: {error.msg})")

    def go(self, fragment):
        self.driver.get(f"{self.base}/{fragment}")

    def log_in(self, user, password):
        driver = self.driver
        for field, value in (("username", user), ("password", password)):
            element = driver.find_element(By.ID, field)
            element.clear()
            element.send_keys(value)
        driver.find_element(By.ID, "login-submit").click()

    # --- the checks, in the order a person would go ---

    def page_loads(self):
        self.go("")
        wait_for("the login form", lambda: self.driver.find_element(By.ID, "login-form").is_displayed())

    def wrong_password_is_refused(self):
        self.log_in("guest", "not-the-password")
        wait_for("'Login failed'", lambda: text_of(self.driver, "login-error") == "Login failed")
        assert not self.driver.find_element(By.ID, "nav").is_displayed(), "the pages are shown"

    def user_without_tags_is_refused(self):
        self.api.put(f"/users/{PLAIN_USER}", {"password": PLAIN_USER, "tags": ""})
        self.log_in(PLAIN_USER, PLAIN_USER)
        wait_for("'Not management user'", lambda: text_of(self.driver, "login-error") == "Not management user")

    def guest_logs_in(self):
        self.log_in("guest", "guest")
        wait_for("the overview", lambda: text_of(self.driver, "overview-node"))

    def overview_shows_the_node(self):
        node = self.api.get("/overview")["node"]
        wait_for(f"node {node}", lambda: text_of(self.driver, "overview-node") == node)
        wait_for("the node in the nodes table", lambda: node in text_of(self.driver, "nodes"))
        wait_for("no alarms", lambda: "No alarms in effect." in text_of(self.driver, "alarms"))

    def overview_draws_the_rates_chart(self):
        probe = """
            const canvas = document.getElementById('rates-chart');
            const legend = document.querySelector('#rates-legend [data-series=publish]');
            if (!canvas || !legend) return null;
            const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            let pixels = 0;
            for (let i = 0; i < data.length; i += 4) {
              if (data[i + 3] > 128 && arguments[0].some(([r, g, b]) => Math.abs(data[i] - r) < 40
                  && Math.abs(data[i + 1] - g) < 40 && Math.abs(data[i + 2] - b) < 40)) pixels += 1;
            }
            return {samples: Number(canvas.dataset.samples || 0), pixels, legend: legend.textContent};
        """
        seen = {}

        def drawn():
            seen.update(self.driver.execute_script(probe, SERIES_RGB) or {})
            publishing = seen.get("legend", "").endswith("/s") and not seen["legend"].endswith(" 0.0/s")
            return seen.get("samples", 0) >= 2 and seen.get("pixels", 0) > 50 and publishing

        wait_for("a publish rate drawn on the chart", drawn, timeout=45)

    def connections_lists_pika(self):
        self.go("#/connections")
        wait_for(f"connection '{CONSUMER_NAME}'", lambda: CONSUMER_NAME in text_of(self.driver, "connections"))
        state = table_cell(self.driver, "connections", CONSUMER_NAME, "State")
        assert state == "running", f"state {state!r}"

    def queues_lists_the_queue(self):
        self.go("#/queues")
        wait_for(
            f"{HELD_QUEUE} with {HELD_COUNT} messages",
            lambda: table_cell(self.driver, "queues", HELD_QUEUE, "Total") == str(HELD_COUNT),
        )
        kind = table_cell(self.driver, "queues", HELD_QUEUE, "Type")
        assert kind == "classic", f"type {kind!r}"

    def queue_page_publishes_and_gets(self):
        driver = self.driver
        driver.find_element(By.LINK_TEXT, HELD_QUEUE).click()
        wait_for("the queue page", lambda: text_of(driver, "queue-name") == HELD_QUEUE)
        assert "%2F" in driver.current_url, f"vhost / is encoded: {driver.current_url}"
        wait_for(f"{HELD_COUNT} ready", lambda: text_of(driver, "queue-ready") == str(HELD_COUNT))
        driver.find_element(By.ID, "publish-payload").send_keys(PAYLOAD)
        driver.find_element(By.ID, "publish-submit").click()
        wait_for("'Message published.'", lambda: text_of(driver, "publish-result") == "Message published.")
        count = driver.find_element(By.ID, "get-count")
        count.clear()
        count.send_keys(str(HELD_COUNT + 1))
        driver.find_element(By.ID, "get-submit").click()

        def payloads():
            shown = [pre.text for pre in driver.find_elements(By.CSS_SELECTOR, "#get-results pre.payload")]
            return shown if len(shown) == HELD_COUNT + 1 else None

        shown = wait_for(f"{HELD_COUNT + 1} messages got", payloads)
        assert shown[-1] == PAYLOAD, f"the last message got is {shown[-1]!r}"
        assert not driver.find_elements(By.ID, "injected"), "the payload was parsed as markup"

    def queue_page_purges(self):
        driver = self.driver
        driver.find_element(By.ID, "purge").click()
        accept_confirm(driver)
        wait_for("'Queue purged.'", lambda: text_of(driver, "purge-result") == "Queue purged.")
        wait_for("0 messages through the API", lambda: self.api.get(f"/queues/%2F/{HELD_QUEUE}")["messages"] == 0)
        wait_for("0 ready on the page", lambda: text_of(driver, "queue-ready") == "0")

    def closing_a_connection_reaches_pika(self):
        driver = self.driver
        self.go("#/connections")
        wait_for(f"connection '{CONSUMER_NAME}'", lambda: CONSUMER_NAME in text_of(driver, "connections"))
        reason = driver.find_element(By.ID, "close-reason")
        reason.clear()
        reason.send_keys(CLOSE_REASON)

        def click_close():
            for row in driver.find_elements(By.CSS_SELECTOR, "#connections tbody tr"):
                if CONSUMER_NAME in row.text:
                    row.find_element(By.TAG_NAME, "button").click()
                    return True
            return False

        wait_for("the Close button", click_close)
        accept_confirm(driver)
        expected = (320, f"CONNECTION_FORCED - {CLOSE_REASON}")
        wait_for("pika to see the close", lambda: self.traffic.consumer_closed, timeout=10)
        assert self.traffic.consumer_closed == expected, f"pika saw {self.traffic.consumer_closed}"
        wait_for("the connection gone from the page", lambda: CONSUMER_NAME not in text_of(driver, "connections"))

    def no_script_errors(self):
        # 401s are the wrong password's answer, logged by the browser as failed loads.
        severe = [
            entry["message"]
            for entry in self.driver.get_log("browser")
            if entry["level"] == "SEVERE" and "status of 401" not in entry["message"]
        ]
        assert not severe, f"console errors: {severe}"

    def logs_out(self):
        self.driver.find_element(By.ID, "logout").click()
        wait_for("the login form", lambda: self.driver.find_element(By.ID, "login-form").is_displayed())
        stored = self.driver.execute_script("return sessionStorage.length")
        assert stored == 0, f"{stored} items left in sessionStorage"


def prepare_queues(port):
    """Declares the queues and leaves HELD_COUNT messages in HELD_QUEUE."""
    parameters = pika.ConnectionParameters(
        host="127.0.0.1", port=port, credentials=pika.PlainCredentials("guest", "guest")
    )
    connection = pika.BlockingConnection(parameters)
    channel = connection.channel()
    channel.queue_declare(WORK_QUEUE)
    channel.queue_declare(HELD_QUEUE)
    channel.confirm_delivery()
    for number in range(HELD_COUNT):
        channel.basic_publish("", HELD_QUEUE, f"held {number}".encode())
    connection.close()


def browser(chromium, chromedriver):
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root, as CI runs
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--no-first-run",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--amqp-port", type=int, required=True)
    parser.add_argument("--management-port", type=int, required=True)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    parser.add_argument("--screenshots", help="where to save a screenshot of each failure")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.management_port}"

    prepare_queues(args.amqp_port)
    traffic = Traffic(args.amqp_port)
    traffic.start()
    driver = browser(args.chromium, args.chromedriver)
    checks = Checks(driver, base, Api(base), traffic, args.screenshots)
    try:
        steps = [
            ("the page loads with a login form", checks.page_loads, True),
            ("a wrong password shows 'Login failed'", checks.wrong_password_is_refused, False),
            ("a user without tags shows 'Not management user'", checks.user_without_tags_is_refused, False),
            ("guest logs in", checks.guest_logs_in, True),
            ("the overview shows the node, its figures and alarms", checks.overview_shows_the_node, False),
            ("the overview draws the publish rate on its chart", checks.overview_draws_the_rates_chart, False),
            ("connections lists the pika connection", checks.connections_lists_pika, False),
            ("queues lists the queue and its messages", checks.queues_lists_the_queue, False),
            ("the queue page publishes and gets a message", checks.queue_page_publishes_and_gets, False),
            ("the queue page purges the queue", checks.queue_page_purges, False),
            ("closing a connection closes pika's with 320", checks.closing_a_connection_reaches_pika, False),
            ("the console shows no script errors", checks.no_script_errors, False),
            ("logging out forgets the credentials", checks.logs_out, False),
        ]
        for index, (name, step, needed_by_the_rest) in enumerate(steps):
            if not checks.run(name, step) and needed_by_the_rest:
                not_run = len(steps) - index - 1
                print(f"FAIL the {not_run} checks after it, which need it, were not run")
                checks.failed += not_run
                break
    finally:
        driver.quit()
        traffic.finish()
    if traffic.errors:
        checks.failed += 1
        print(f"FAIL pika's traffic: {traffic.errors}")
    print(f"pika published {traffic.published} and consumed {traffic.consumed} messages")
    print(f"ui: {checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
