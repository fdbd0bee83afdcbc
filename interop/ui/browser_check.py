"""Drives the management web UI in headless Chromium through WebDriver, against a running
Sluice that carries real AMQP traffic from pika, and checks what a person would see, and,
through the API and AMQP, that what they did in the admin pages took effect.

Run by interop/ui/check, which starts the broker and installs what this needs.
"""
import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
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
from selenium.webdriver.support.ui import Select

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
# What the admin pages create, change and delete again.
ADMIN_LINKS = ["Users", "Virtual hosts", "Policies", "Definitions"]
MADE_USER = "ui-check-made"
MADE_PASSWORD = "made-first"
MADE_PASSWORD_CHANGED = "made-second"
MADE_VHOST = "ui-check-vhost"
CONFIGURE = r"^ui-check\."  # the made user may declare these queues in MADE_VHOST only
POLICY = "ui-check-policy"
POLICY_PATTERN = r"^ui-check\.held$"
EXPORT_FILE = "ui-check-definitions.json"
IMPORTED_VHOST = "ui-check-imported"
IMPORTED_QUEUE = "ui-check.imported"
IMPORTED = {
    "vhosts": [{"name": IMPORTED_VHOST}],
    "permissions": [{"user": "guest", "vhost": IMPORTED_VHOST, "configure": ".*", "write": ".*", "read": ".*"}],
    "queues": [
        {"name": IMPORTED_QUEUE, "vhost": IMPORTED_VHOST, "durable": True, "auto_delete": False, "arguments": {}}
    ],
}
MANAGEMENT_USER = "ui-check-management"  # tagged management: no admin pages
POLICYMAKER_USER = "ui-check-policymaker"  # tagged policymaker: the policies page only


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
    """The management API, as guest unless told, to check what the UI did."""

    def __init__(self, base):
        self.base = base

    def call(self, method, path, body=None, credentials=("guest", "guest")):
        """One call; answers its status and its JSON body (None when empty), refusals too."""
        token = base64.b64encode(":".join(credentials).encode()).decode()
        headers = {"Authorization": f"Basic {token}"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        request = urllib.request.Request(self.base + "/api" + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, text = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read()
        return status, json.loads(text) if text else None

    def get(self, path, credentials=("guest", "guest")):
        status, body = self.call("GET", path, credentials=credentials)
        assert status == 200, f"GET {path}: {status} {body}"
        return body

    def put(self, path, body):
        status, answer = self.call("PUT", path, body)
        assert status in (201, 204), f"PUT {path}: {status} {answer}"

    def status(self, path):
        return self.call("GET", path)[0]


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


def fill(driver, element_id, value):
    element = driver.find_element(By.ID, element_id)
    element.clear()
    element.send_keys(value)


def click(driver, by, value):
    """Clicks an element, waiting for it: a page's refresh may replace it meanwhile."""

    def clicked():
        driver.find_element(by, value).click()
        return True

    wait_for(f"{value} to click", clicked)


def select(driver, element_id, value):
    """Chooses `value` in a select, once a refresh has listed it."""

    def chosen():
        Select(driver.find_element(By.ID, element_id)).select_by_value(value)
        return True

    wait_for(f"{value!r} in #{element_id}", lambda: _ignoring_missing_option(chosen))


def _ignoring_missing_option(probe):
    try:
        return probe()
    except NoSuchElementException:  # Select raises it for an option not there yet
        return False


def click_in_row(driver, container_id, row_text, button_text):
    """Clicks the button labelled button_text in the row of #container_id that contains row_text."""
    for row in driver.find_elements(By.CSS_SELECTOR, f"#{container_id} tbody tr"):
        if row_text in row.text:
            for button in row.find_elements(By.TAG_NAME, "button"):
                if button.text == button_text:
                    button.click()
                    return True
    return False


def nav_links(driver):
    return [link.text for link in driver.find_elements(By.CSS_SELECTOR, "#nav a") if link.is_displayed()]


def declare_as(port, vhost, user, password, queue):
    """Declares an exclusive `queue` through AMQP as `user` in `vhost`: None, or the channel's
    refusal as (code, text)."""
    parameters = pika.ConnectionParameters(
        host="127.0.0.1", port=port, virtual_host=vhost, credentials=pika.PlainCredentials(user, password)
    )
    connection = pika.BlockingConnection(parameters)
    try:
        channel = connection.channel()
        try:
            channel.queue_declare(queue, exclusive=True)
        except pika.exceptions.ChannelClosedByBroker as closed:
            return (closed.reply_code, closed.reply_text)
        return None
    finally:
        if connection.is_open:
            connection.close()


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
    def __init__(self, driver, base, api, traffic, screenshots, files):
        self.driver = driver
        self.base = base
        self.api = api
        self.traffic = traffic
        self.screenshots = screenshots
        self.files = files  # the browser's downloads, and the files it uploads
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

    def log_out(self):
        self.driver.find_element(By.ID, "logout").click()
        wait_for("the login form", lambda: self.driver.find_element(By.ID, "login-form").is_displayed())

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

        wait_for("the Close button", lambda: click_in_row(driver, "connections", CONSUMER_NAME, "Close"))
        accept_confirm(driver)
        expected = (320, f"CONNECTION_FORCED - {CLOSE_REASON}")
        wait_for("pika to see the close", lambda: self.traffic.consumer_closed, timeout=10)
        assert self.traffic.consumer_closed == expected, f"pika saw {self.traffic.consumer_closed}"
        wait_for("the connection gone from the page", lambda: CONSUMER_NAME not in text_of(driver, "connections"))

    def no_script_errors(self):
        # The API's refusals (a wrong password, a bad policy or file, an object just deleted)
        # are logged by the browser as failed loads; the pages show them, which other checks see.
        severe = [
            entry["message"]
            for entry in self.driver.get_log("browser")
            if entry["level"] == "SEVERE"
            and not ("/api/" in entry["message"] and "responded with a status of 4" in entry["message"])
        ]
        assert not severe, f"console errors: {severe}"

    def logs_out(self):
        self.log_out()
        stored = self.driver.execute_script("return sessionStorage.length")
        assert stored == 0, f"{stored} items left in sessionStorage"

    # --- the admin pages, as guest (administrator) ---

    def admin_pages_are_offered(self):
        wait_for(f"the links {ADMIN_LINKS}", lambda: set(ADMIN_LINKS) <= set(nav_links(self.driver)))

    def users_page_adds_a_user(self):
        driver = self.driver
        self.go("#/users")
        wait_for("guest in the list", lambda: table_cell(driver, "users", "guest", "Tags") == "administrator")
        fill(driver, "user-name", MADE_USER)
        fill(driver, "user-password", MADE_PASSWORD)
        fill(driver, "user-tags", "management")
        driver.find_element(By.ID, "user-submit").click()
        wait_for("'User added.'", lambda: text_of(driver, "user-result") == f"User {MADE_USER} added.")
        wait_for("its tags listed", lambda: table_cell(driver, "users", MADE_USER, "Tags") == "management")
        wait_for("its password listed", lambda: table_cell(driver, "users", MADE_USER, "Has password") == "yes")
        me = self.api.get("/whoami", (MADE_USER, MADE_PASSWORD))
        assert me == {"name": MADE_USER, "tags": ["management"]}, f"the API says {me}"

    def user_page_changes_tags_and_password(self):
        driver = self.driver
        click(driver, By.LINK_TEXT, MADE_USER)
        wait_for("the user page", lambda: text_of(driver, "user-name-shown") == MADE_USER)
        tags = driver.find_element(By.ID, "user-tags")
        wait_for("its tags in the form", lambda: tags.get_attribute("value") == "management")
        fill(driver, "user-tags", "policymaker")
        fill(driver, "user-password", MADE_PASSWORD_CHANGED)
        driver.find_element(By.ID, "user-submit").click()
        wait_for("'User updated.'", lambda: text_of(driver, "user-result") == f"User {MADE_USER} updated.")
        wait_for("the new tags shown", lambda: text_of(driver, "user-tags-shown") == "policymaker")
        me = self.api.get("/whoami", (MADE_USER, MADE_PASSWORD_CHANGED))
        assert me == {"name": MADE_USER, "tags": ["policymaker"]}, f"the API says {me}"
        old = self.api.call("GET", "/whoami", credentials=(MADE_USER, MADE_PASSWORD))
        assert old[0] == 401, f"the old password still works: {old}"

    def vhosts_page_adds_a_vhost(self):
        driver = self.driver
        self.go("#/vhosts")
        wait_for("the list", lambda: driver.find_element(By.CSS_SELECTOR, "#vhosts table"))
        fill(driver, "vhost-name", MADE_VHOST)
        driver.find_element(By.ID, "vhost-submit").click()
        added = f"Virtual host {MADE_VHOST} added."
        wait_for(repr(added), lambda: text_of(driver, "vhost-result") == added)
        wait_for("it listed, running", lambda: table_cell(driver, "vhosts", MADE_VHOST, "State") == "running")
        assert self.api.get(f"/vhosts/{MADE_VHOST}")["name"] == MADE_VHOST

    def vhost_page_sets_a_permission(self):
        driver = self.driver
        click(driver, By.LINK_TEXT, MADE_VHOST)
        wait_for("the vhost page", lambda: text_of(driver, "vhost-name-shown") == MADE_VHOST)
        select(driver, "permission-user", MADE_USER)
        fill(driver, "permission-configure", CONFIGURE)
        driver.find_element(By.ID, "permission-submit").click()
        added = f"Permission of {MADE_USER} added."
        wait_for(repr(added), lambda: text_of(driver, "permission-result") == added)
        wait_for("it listed", lambda: table_cell(driver, "vhost-permissions", MADE_USER, "Configure") == CONFIGURE)
        permission = self.api.get(f"/permissions/{MADE_VHOST}/{MADE_USER}")
        wanted = {"user": MADE_USER, "vhost": MADE_VHOST, "configure": CONFIGURE, "write": ".*", "read": ".*"}
        assert permission == wanted, f"the API says {permission}"
        port = self.traffic.port
        allowed = declare_as(port, MADE_VHOST, MADE_USER, MADE_PASSWORD_CHANGED, "ui-check.allowed")
        assert allowed is None, f"declaring ui-check.allowed: {allowed}"
        refused = declare_as(port, MADE_VHOST, MADE_USER, MADE_PASSWORD_CHANGED, "elsewhere")
        assert refused and refused[0] == 403, f"declaring elsewhere: {refused}"

    def policies_page_adds_a_policy(self):
        driver = self.driver
        self.go("#/policies")
        select(driver, "policy-vhost", "/")
        fill(driver, "policy-name", POLICY)
        fill(driver, "policy-pattern", POLICY_PATTERN)
        Select(driver.find_element(By.ID, "policy-apply-to")).select_by_value("queues")
        fill(driver, "policy-priority", "3")
        fill(driver, "policy-definition", "max-length=100\noverflow=reject-publish")
        driver.find_element(By.ID, "policy-submit").click()
        wait_for("'Policy added.'", lambda: text_of(driver, "policy-result") == f"Policy {POLICY} added.")
        listed = "max-length: 100\noverflow: reject-publish"
        wait_for("it listed", lambda: table_cell(driver, "policies", POLICY, "Definition") == listed)
        policy = self.api.get(f"/policies/%2F/{POLICY}")
        wanted = {"vhost": "/", "name": POLICY, "pattern": POLICY_PATTERN, "apply-to": "queues", "priority": 3,
                  "definition": {"max-length": 100, "overflow": "reject-publish"}}
        assert policy == wanted, f"the API says {policy}"
        held = f"/queues/%2F/{HELD_QUEUE}"
        wait_for(f"{HELD_QUEUE} under the policy", lambda: self.api.get(held)["policy"] == POLICY)

    def policies_page_shows_a_refusal(self):
        driver = self.driver
        fill(driver, "policy-name", f"{POLICY}-bad")
        fill(driver, "policy-definition", "max-length=lots")
        driver.find_element(By.ID, "policy-submit").click()
        refusal = '<<"lots">> is not a valid maximum length'
        wait_for(f"the API's refusal {refusal!r}", lambda: refusal in text_of(driver, "policy-result"))
        assert text_of(driver, "policy-result").startswith("Validation failed")
        assert self.api.status(f"/policies/%2F/{POLICY}-bad") == 404

    def definitions_export_downloads(self):
        driver = self.driver
        self.go("#/definitions")
        fill(driver, "export-filename", EXPORT_FILE)
        driver.find_element(By.ID, "export-submit").click()
        wait_for("'Downloaded ...'", lambda: text_of(driver, "export-result").startswith(f"Downloaded {EXPORT_FILE}: "))
        path = os.path.join(self.files, EXPORT_FILE)

        def downloaded():
            with open(path) as file:  # a partial download is not JSON yet
                return json.load(file)

        exported = wait_for("the downloaded file", lambda: _ignoring_partial_file(downloaded))
        assert exported == self.api.get("/definitions"), "the file is not what the API exports"
        assert MADE_USER in [user["name"] for user in exported["users"]]
        assert MADE_VHOST in [vhost["name"] for vhost in exported["vhosts"]]
        assert POLICY in [policy["name"] for policy in exported["policies"]]
        permission = {"user": MADE_USER, "vhost": MADE_VHOST, "configure": CONFIGURE, "write": ".*", "read": ".*"}
        assert permission in exported["permissions"], exported["permissions"]

    def definitions_import_uploads_a_file(self):
        driver = self.driver
        path = os.path.join(self.files, "ui-check-import.json")
        with open(path, "w") as file:
            json.dump(IMPORTED, file)
        driver.find_element(By.ID, "import-file").send_keys(path)
        driver.find_element(By.ID, "import-submit").click()
        wait_for("'Imported ...'", lambda: text_of(driver, "import-result") == "Imported ui-check-import.json.")
        queue = self.api.get(f"/queues/{IMPORTED_VHOST}/{IMPORTED_QUEUE}")
        assert queue["durable"] is True, f"the API says {queue}"
        bad = os.path.join(self.files, "ui-check-not-json.json")
        with open(bad, "w") as file:
            file.write("{not json")
        driver.find_element(By.ID, "import-file").send_keys(bad)
        driver.find_element(By.ID, "import-submit").click()
        wait_for("the API's refusal", lambda: text_of(driver, "import-result") == "failed_to_parse_json")

    def policies_page_deletes_the_policy(self):
        driver = self.driver
        self.go("#/policies")
        wait_for("its Delete button", lambda: click_in_row(driver, "policies", POLICY, "Delete"))
        accept_confirm(driver)
        wait_for("'Policy deleted.'", lambda: text_of(driver, "policy-result") == f"Policy {POLICY} deleted.")
        wait_for("it gone from the list", lambda: POLICY not in text_of(driver, "policies"))
        assert self.api.status(f"/policies/%2F/{POLICY}") == 404
        assert self.api.get(f"/queues/%2F/{HELD_QUEUE}")["policy"] is None

    def vhost_page_clears_the_permission(self):
        driver = self.driver
        self.go(f"#/vhosts/{MADE_VHOST}")
        wait_for("its Clear button", lambda: click_in_row(driver, "vhost-permissions", MADE_USER, "Clear"))
        accept_confirm(driver)
        cleared = f"Permission of {MADE_USER} cleared."
        wait_for(repr(cleared), lambda: text_of(driver, "permission-result") == cleared)
        wait_for("it gone from the list", lambda: MADE_USER not in text_of(driver, "vhost-permissions"))
        assert self.api.status(f"/permissions/{MADE_VHOST}/{MADE_USER}") == 404
        try:
            declare_as(self.traffic.port, MADE_VHOST, MADE_USER, MADE_PASSWORD_CHANGED, "ui-check.allowed")
        except pika.exceptions.AMQPConnectionError as error:
            assert "530" in repr(error) or "NOT_ALLOWED" in repr(error), f"refused otherwise: {error!r}"
        else:
            raise AssertionError(f"{MADE_USER} still opens {MADE_VHOST}")

    def vhost_pages_delete_the_vhosts(self):
        driver = self.driver
        for vhost in (MADE_VHOST, IMPORTED_VHOST):
            self.go(f"#/vhosts/{vhost}")
            wait_for("the vhost page", lambda: text_of(driver, "vhost-name-shown") == vhost)
            driver.find_element(By.ID, "vhost-delete").click()
            accept_confirm(driver)
            wait_for("the list again", lambda: driver.current_url.endswith("#/vhosts"))
            wait_for(f"{vhost} gone from the list", lambda: driver.find_element(By.CSS_SELECTOR, "#vhosts table")
                     and vhost not in text_of(driver, "vhosts"))
            assert self.api.status(f"/vhosts/{vhost}") == 404, f"{vhost} is still there"

    def user_page_deletes_the_user(self):
        driver = self.driver
        self.go(f"#/users/{MADE_USER}")
        wait_for("the user page", lambda: text_of(driver, "user-name-shown") == MADE_USER)
        driver.find_element(By.ID, "user-delete").click()
        accept_confirm(driver)
        wait_for("the list again", lambda: driver.current_url.endswith("#/users"))
        wait_for(f"{MADE_USER} gone from the list", lambda: driver.find_element(By.CSS_SELECTOR, "#users table")
                 and MADE_USER not in text_of(driver, "users"))
        assert self.api.status(f"/users/{MADE_USER}") == 404

    # --- what other tags are shown ---

    def management_user_is_offered_no_admin_pages(self):
        driver = self.driver
        self.api.put(f"/users/{MANAGEMENT_USER}", {"password": MANAGEMENT_USER, "tags": "management"})
        self.log_in(MANAGEMENT_USER, MANAGEMENT_USER)
        wait_for("the pages", lambda: "Overview" in nav_links(driver))
        shown = set(ADMIN_LINKS) & set(nav_links(driver))
        assert not shown, f"admin links shown: {shown}"
        self.go("#/users")
        wait_for("the API's refusal", lambda: text_of(driver, "status") == "Not administrator user")
        self.log_out()

    def policymaker_is_offered_policies(self):
        driver = self.driver
        self.api.put(f"/users/{POLICYMAKER_USER}", {"password": POLICYMAKER_USER, "tags": "policymaker"})
        self.api.put(f"/permissions/%2F/{POLICYMAKER_USER}", {"configure": ".*", "write": ".*", "read": ".*"})
        self.log_in(POLICYMAKER_USER, POLICYMAKER_USER)
        wait_for("the pages", lambda: "Overview" in nav_links(driver))
        shown = set(ADMIN_LINKS) & set(nav_links(driver))
        assert shown == {"Policies"}, f"admin links shown: {shown}"
        click(driver, By.LINK_TEXT, "Policies")
        wait_for("the policy form", lambda: driver.find_element(By.ID, "policy-form").is_displayed())
        self.log_out()


def _ignoring_partial_file(probe):
    try:
        return probe()
    except (FileNotFoundError, json.JSONDecodeError):
        return None


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


def browser(chromium, chromedriver, downloads):
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    options.add_experimental_option(
        "prefs", {"download.default_directory": downloads, "download.prompt_for_download": False}
    )
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
    files = tempfile.mkdtemp(prefix="sluice-ui-files.")
    driver = browser(args.chromium, args.chromedriver, files)
    checks = Checks(driver, base, Api(base), traffic, args.screenshots, files)
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
            ("an administrator is offered the admin pages", checks.admin_pages_are_offered, False),
            ("the users page adds a user who can log in", checks.users_page_adds_a_user, False),
            ("the user page changes the tags and the password", checks.user_page_changes_tags_and_password, False),
            ("the vhosts page adds a vhost", checks.vhosts_page_adds_a_vhost, False),
            ("the vhost page sets a permission that AMQP applies", checks.vhost_page_sets_a_permission, False),
            ("the policies page adds a policy that applies to a queue", checks.policies_page_adds_a_policy, False),
            ("the policies page shows the API's refusal", checks.policies_page_shows_a_refusal, False),
            ("definitions export downloads what the API exports", checks.definitions_export_downloads, False),
            ("definitions import uploads a file, and shows a refusal", checks.definitions_import_uploads_a_file, False),
            ("the policies page deletes the policy", checks.policies_page_deletes_the_policy, False),
            ("the vhost page clears the permission", checks.vhost_page_clears_the_permission, False),
            ("the vhost page deletes vhosts", checks.vhost_pages_delete_the_vhosts, False),
            ("the user page deletes the user", checks.user_page_deletes_the_user, False),
            ("logging out forgets the credentials", checks.logs_out, False),
            ("a management user is offered no admin pages", checks.management_user_is_offered_no_admin_pages, False),
            ("a policymaker is offered the policies page", checks.policymaker_is_offered_policies, False),
            ("the console shows no script errors", checks.no_script_errors, False),
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
        shutil.rmtree(files, ignore_errors=True)
    if traffic.errors:
        checks.failed += 1
        print(f"FAIL pika's traffic: {traffic.errors}")
    print(f"pika published {traffic.published} and consumed {traffic.consumed} messages")
    print(f"ui: {checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
