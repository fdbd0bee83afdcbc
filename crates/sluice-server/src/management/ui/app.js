// Sluice management UI: hash-routed pages over the management HTTP API.
// Plain JavaScript, no framework and no build step. Server data reaches the
// page only as text nodes and attributes, never as HTML. The admin pages
// (users, vhosts, policies, definitions) are in admin.js, loaded after this.
'use strict';

// RabbitMQ's collect_statistics_interval: the API's rates move no faster.
const REFRESH_MS = 5000;
// Ten minutes of rates at one sample per refresh.
const CHART_SAMPLES_MAX = 120;
// sessionStorage keys: the Authorization header's value, the user's name
// and tags (a JSON list).
const AUTH_KEY = 'sluice.auth';
const USER_KEY = 'sluice.user';
const TAGS_KEY = 'sluice.tags';
// RabbitMQ's text for a connection closed through the API without a reason.
const CLOSE_REASON_DEFAULT = 'Closed via management plugin';

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;

// el('td', {class: 'num', onclick: f}, 'text', node, ...): attributes are
// set with setAttribute and children added as text, so nothing is parsed.
function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// ---- the API ----

class ApiError extends Error {
  constructor(status, body) {
    const reason = body && body.reason !== undefined ? body.reason : body && body.error;
    super(reason === undefined ? `HTTP ${status}` : typeof reason === 'string' ? reason : JSON.stringify(reason));
    this.status = status;
  }
}

// "Basic " + base64 of the UTF-8 "user:password".
function basicAuth(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  return 'Basic ' + btoa(String.fromCharCode(...bytes));
}

// One call; answers {status, body}. Credentials are sent explicitly and
// the browser's own are left out ('omit'), so a 401 never opens its dialog.
// options.body is sent as JSON, options.text (JSON already) as it is.
async function request(method, path, options = {}) {
  const headers = { Authorization: options.auth || sessionStorage.getItem(AUTH_KEY) || '' };
  Object.assign(headers, options.headers);
  const init = { method, headers, credentials: 'omit', cache: 'no-store' };
  if (options.body !== undefined || options.text !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = options.text !== undefined ? options.text : JSON.stringify(options.body);
  }
  const response = await fetch('/api' + path, init);
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = { reason: text }; }
  // The password changed or the user went away: back to the login form.
  if (response.status === 401 && !options.auth && body && body.reason === 'Login failed') {
    logout('Login failed');
  }
  return { status: response.status, body };
}

// As request, but a status other than 2xx throws an ApiError with the reason.
async function api(method, path, options) {
  const { status, body } = await request(method, path, options);
  if (status < 200 || status > 299) throw new ApiError(status, body);
  return body;
}

// ---- formatting ----

function fmtNumber(value) {
  return value === undefined || value === null ? '' : Number(value).toLocaleString('en');
}

function fmtRate(value) {
  if (value === undefined || value === null) return '';
  return (value < 10 ? value.toFixed(1) : Math.round(value).toLocaleString('en')) + '/s';
}

function fmtBytes(bytes) {
  if (bytes === undefined || bytes === null) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let unit = 0;
  while (bytes >= 1024 && unit < units.length - 1) { bytes /= 1024; unit += 1; }
  return `${unit === 0 ? bytes : bytes.toFixed(1)} ${units[unit]}`;
}

const fmtByteRate = (value) => (value === undefined || value === null ? '' : `${fmtBytes(Math.round(value))}/s`);

function fmtDuration(ms) {
  if (ms === undefined || ms === null) return '';
  if (ms < 1000) return `${ms} ms`;
  const seconds = Math.floor(ms / 1000);
  const parts = [[Math.floor(seconds / 86400), 'd'], [Math.floor(seconds / 3600) % 24, 'h'],
    [Math.floor(seconds / 60) % 60, 'm'], [seconds % 60, 's']];
  return parts.filter(([n]) => n > 0).slice(0, 2).map(([n, unit]) => n + unit).join(' ') || '0s';
}

// The per-second rate of a counter: object[key + '_details'].rate.
function rateOf(object, key) {
  const details = object && object[key + '_details'];
  return details ? details.rate : undefined;
}

const statRate = (object, key) => rateOf(object && object.message_stats, key);

// A value with a highlight when `bad`: 'warn' or 'bad'.
function flagged(text, level) {
  return level ? el('span', { class: `flag-${level}` }, text) : text;
}

function connectionState(state) {
  return flagged(state, { flow: 'warn', blocking: 'warn', blocked: 'bad' }[state]);
}

function features(object) {
  return [object.durable && 'D', object.auto_delete && 'AD', object.internal && 'I',
    object.exclusive && 'Excl'].filter(Boolean).join(' ');
}

// columns: [label, cell(row), 'num'?]; rows: objects; rowKey names each <tr>.
function table(columns, rows, rowKey) {
  const head = el('tr', {}, columns.map(([label, , kind]) => el('th', { class: kind }, label)));
  const body = rows.map((row) => el('tr', { 'data-name': rowKey ? rowKey(row) : null },
    columns.map(([, cell, kind]) => el('td', { class: kind }, cell(row)))));
  if (rows.length === 0) body.push(el('tr', {}, el('td', { colspan: columns.length, class: 'muted' }, 'None.')));
  return el('table', {}, el('thead', {}, head), el('tbody', {}, body));
}

// A two-column table of [label, value] pairs.
function details(pairs) {
  return el('table', { class: 'details' },
    pairs.map(([label, value]) => el('tr', {}, el('th', {}, label), el('td', {}, value))));
}

function setStatus(text, isError) {
  $('status').replaceChildren(isError ? el('span', { class: 'error' }, text) : text);
}

// The outcome of an action, shown beside its form or button.
function report(node, text, isError) {
  node.replaceChildren(el('span', { class: isError ? 'error' : 'ok' }, text));
}

// Whether the user holds one of `tags` (space-separated). The pages and
// actions the API would refuse them are not shown, as in RabbitMQ's UI.
function holdsTag(tags) {
  let held = [];
  try { held = JSON.parse(sessionStorage.getItem(TAGS_KEY)) || []; } catch (_) { held = []; }
  return tags.split(' ').some((tag) => held.includes(tag));
}

// ---- the overview's rates chart ----

const SERIES = [
  { key: 'publish', label: 'Publish', color: '#1f6feb' },
  { key: 'deliver_get', label: 'Deliver / get', color: '#12b76a' },
  { key: 'ack', label: 'Acknowledge', color: '#f79009' },
];

// The smallest of 1, 2, 5 × 10^n at or above `value`.
function niceMax(value) {
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  return [1, 2, 5, 10].map((step) => step * power).find((step) => step >= value);
}

// Draws samples ({time, publish, deliver_get, ack}) over the last ten minutes.
function drawChart(canvas, samples) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 900;
  const height = canvas.clientHeight || 220;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext('2d');
  g.scale(ratio, ratio);
  const left = 60, right = width - 12, top = 10, bottom = height - 22;
  const max = niceMax(Math.max(1, ...samples.flatMap((sample) => SERIES.map((s) => sample[s.key]))));
  g.font = '11px system-ui, sans-serif';
  g.lineWidth = 1;
  // Five steps of a 1, 2 or 5 × 10^n maximum are round numbers too.
  for (let line = 0; line <= 5; line += 1) {
    const y = top + ((bottom - top) * line) / 5;
    g.strokeStyle = '#eaecf0';
    g.beginPath(); g.moveTo(left, y); g.lineTo(right, y); g.stroke();
    g.fillStyle = '#667085';
    g.fillText(fmtRate((max * (5 - line)) / 5), 4, y + 4);
  }
  g.fillText('10 min ago', left, height - 6);
  g.fillText('now', right - 20, height - 6);
  const now = samples.length ? samples[samples.length - 1].time : 0;
  const span = CHART_SAMPLES_MAX * REFRESH_MS;
  const x = (time) => right - ((right - left) * (now - time)) / span;
  const y = (value) => bottom - ((bottom - top) * value) / max;
  g.lineWidth = 2;
  // Publish drawn last, on top: equal rates draw one line.
  for (const series of [...SERIES].reverse()) {
    g.strokeStyle = g.fillStyle = series.color;
    g.beginPath();
    samples.forEach((sample, index) => {
      if (index === 0) g.moveTo(x(sample.time), y(sample[series.key]));
      else g.lineTo(x(sample.time), y(sample[series.key]));
    });
    g.stroke();
    const last = samples[samples.length - 1];
    if (last) { g.beginPath(); g.arc(x(last.time), y(last[series.key]), 3, 0, 2 * Math.PI); g.fill(); }
  }
  canvas.dataset.samples = String(samples.length);
}

// ---- pages: each builds its frame and answers a refresh function ----

function overviewPage(main) {
  const summary = el('div');
  const canvas = el('canvas', { id: 'rates-chart', width: 900, height: 220 });
  const legend = el('div', { class: 'legend', id: 'rates-legend' });
  const totals = el('div', { class: 'tiles' });
  const nodes = el('div', { id: 'nodes' });
  const alarms = el('div', { id: 'alarms' });
  main.append(el('h1', {}, 'Overview'), summary, el('h2', {}, 'Message rates'), canvas, legend,
    el('h2', {}, 'Totals'), totals, el('h2', {}, 'Nodes'), nodes, el('h2', {}, 'Alarms'), alarms);
  const samples = [];
  return async () => {
    const [overview, nodeList, alarmCheck] = await Promise.all([
      api('GET', '/overview'), request('GET', '/nodes'), request('GET', '/health/checks/alarms')]);
    const stats = overview.message_stats || {};
    const sample = { time: Date.now() };
    for (const series of SERIES) sample[series.key] = rateOf(stats, series.key) || 0;
    samples.push(sample);
    if (samples.length > CHART_SAMPLES_MAX) samples.shift();
    drawChart(canvas, samples);
    legend.replaceChildren(...SERIES.map((s) => {
      const swatch = el('i');
      swatch.style.background = s.color; // CSSOM, which the page's CSP allows
      return el('span', { 'data-series': s.key }, swatch, `${s.label} ${fmtRate(sample[s.key])}`);
    }));
    summary.replaceChildren(details([
      ['Node', el('span', { id: 'overview-node' }, overview.node)],
      ['Cluster', overview.cluster_name],
      ['Product', `${overview.product_name} ${overview.product_version}`],
      ['RabbitMQ version', overview.rabbitmq_version],
      ['Management version', overview.management_version],
      ['Logged in as', sessionStorage.getItem(USER_KEY)],
    ]));
    const queueTotals = overview.queue_totals || {};
    const objectTotals = overview.object_totals || {};
    totals.replaceChildren(...[
      ['Messages', queueTotals.messages], ['Ready', queueTotals.messages_ready],
      ['Unacked', queueTotals.messages_unacknowledged], ['Connections', objectTotals.connections],
      ['Channels', objectTotals.channels], ['Exchanges', objectTotals.exchanges],
      ['Queues', objectTotals.queues], ['Consumers', objectTotals.consumers],
    ].map(([label, value]) => el('div', { class: 'tile' },
      el('div', { class: 'value' }, fmtNumber(value || 0)), el('div', { class: 'label' }, label))));
    nodes.replaceChildren(nodeList.status === 200 ? nodesTable(nodeList.body)
      : el('p', { class: 'error' }, new ApiError(nodeList.status, nodeList.body).message));
    alarms.replaceChildren(alarmsView(alarmCheck));
  };
}

function nodesTable(nodes) {
  const used = (value, limit, alarm) => flagged(`${fmtBytes(value)} / ${fmtBytes(limit)}`, alarm && 'bad');
  return table([
    ['Name', (n) => n.name],
    ['Running', (n) => flagged(n.running ? 'yes' : 'no', !n.running && 'bad')],
    ['Memory used / watermark', (n) => n.mem_used === undefined ? '' : used(n.mem_used, n.mem_limit, n.mem_alarm)],
    ['Disk free / limit', (n) => n.disk_free === undefined ? '' : used(n.disk_free, n.disk_free_limit, n.disk_free_alarm)],
    ['File descriptors', (n) => n.fd_used === undefined ? '' : `${fmtNumber(n.fd_used)} / ${fmtNumber(n.fd_total)}`, 'num'],
    ['Sockets', (n) => n.sockets_used === undefined ? '' : `${fmtNumber(n.sockets_used)} / ${fmtNumber(n.sockets_total)}`, 'num'],
    ['Uptime', (n) => fmtDuration(n.uptime), 'num'],
  ], nodes, (n) => n.name);
}

// /api/health/checks/alarms: 200 ok, or 503 with the alarms in effect.
function alarmsView({ status, body }) {
  if (status === 200) return el('p', { class: 'ok' }, 'No alarms in effect.');
  if (status === 503 && body && Array.isArray(body.alarms)) {
    return el('ul', {}, body.alarms.map((alarm) =>
      el('li', {}, flagged(`${alarm.resource} alarm`, 'bad'), ` on ${alarm.node}`)));
  }
  return el('p', { class: 'error' }, new ApiError(status, body).message);
}

function connectionsPage(main) {
  const reason = el('input', { id: 'close-reason', size: 40, value: CLOSE_REASON_DEFAULT });
  const list = el('div', { id: 'connections' });
  main.append(el('h1', {}, 'Connections'),
    el('p', {}, el('label', {}, 'Reason given when closing: ', reason)), list);
  async function close(connection) {
    if (!window.confirm(`Close connection ${connection.name}?`)) return;
    try {
      await api('DELETE', `/connections/${enc(connection.name)}`, { headers: { 'X-Reason': reason.value } });
      setStatus(`Closed ${connection.name}.`);
    } catch (error) {
      setStatus(`Closing ${connection.name}: ${error.message}`, true);
    }
    await refresh();
  }
  async function refresh() {
    const connections = await api('GET', '/connections');
    list.replaceChildren(table([
      ['Name', (c) => [c.user_provided_name ? el('div', {}, c.user_provided_name) : null,
        el('div', { class: c.user_provided_name ? 'muted' : null }, c.name)]],
      ['User', (c) => c.user], ['Vhost', (c) => c.vhost],
      ['State', (c) => connectionState(c.state)],
      ['Time in flow', (c) => fmtDuration(c.time_in_flow_ms), 'num'],
      ['Channels', (c) => fmtNumber(c.channels), 'num'],
      ['From client', (c) => fmtByteRate(rateOf(c, 'recv_oct')), 'num'],
      ['To client', (c) => fmtByteRate(rateOf(c, 'send_oct')), 'num'],
      ['', (c) => el('button', { type: 'button', class: 'danger', onclick: () => close(c) }, 'Close')],
    ], connections, (c) => c.name));
  }
  return refresh;
}

function channelsPage(main) {
  const list = el('div', { id: 'channels' });
  main.append(el('h1', {}, 'Channels'), list);
  return async () => {
    const channels = await api('GET', '/channels');
    list.replaceChildren(table([
      ['Channel', (c) => c.name], ['User', (c) => c.user], ['Vhost', (c) => c.vhost],
      ['Mode', (c) => [c.confirm && 'C', c.transactional && 'T'].filter(Boolean).join(' ')],
      ['State', (c) => connectionState(c.state)],
      ['Prefetch', (c) => fmtNumber(c.prefetch_count), 'num'],
      ['Unacked', (c) => fmtNumber(c.messages_unacknowledged), 'num'],
      ['Consumers', (c) => fmtNumber(c.consumer_count), 'num'],
      ['Publish', (c) => fmtRate(statRate(c, 'publish')), 'num'],
      ['Deliver / get', (c) => fmtRate(statRate(c, 'deliver_get')), 'num'],
      ['Ack', (c) => fmtRate(statRate(c, 'ack')), 'num'],
    ], channels, (c) => c.name));
  };
}

function exchangesPage(main) {
  const list = el('div', { id: 'exchanges' });
  main.append(el('h1', {}, 'Exchanges'), list);
  return async () => {
    const exchanges = await api('GET', '/exchanges');
    list.replaceChildren(table([
      ['Vhost', (x) => x.vhost], ['Name', (x) => x.name || '(AMQP default)'], ['Type', (x) => x.type],
      ['Features', (x) => features(x)],
      ['Message rate in', (x) => fmtRate(statRate(x, 'publish_in')), 'num'],
      ['Message rate out', (x) => fmtRate(statRate(x, 'publish_out')), 'num'],
    ], exchanges, (x) => `${x.vhost}/${x.name}`));
  };
}

const queueHref = (q) => `#/queues/${enc(q.vhost)}/${enc(q.name)}`;

function queuesPage(main) {
  const list = el('div', { id: 'queues' });
  main.append(el('h1', {}, 'Queues'), list);
  return async () => {
    const queues = await api('GET', '/queues');
    list.replaceChildren(table([
      ['Vhost', (q) => q.vhost], ['Name', (q) => el('a', { href: queueHref(q) }, q.name)],
      ['Type', (q) => q.type], ['Features', (q) => features(q)],
      ['State', (q) => flagged(q.state, q.state !== 'running' && 'bad')],
      ['Ready', (q) => fmtNumber(q.messages_ready), 'num'],
      ['Unacked', (q) => fmtNumber(q.messages_unacknowledged), 'num'],
      ['Total', (q) => fmtNumber(q.messages), 'num'],
      ['Consumers', (q) => fmtNumber(q.consumers), 'num'],
      ['Incoming', (q) => fmtRate(statRate(q, 'publish')), 'num'],
      ['Deliver / get', (q) => fmtRate(statRate(q, 'deliver_get')), 'num'],
      ['Ack', (q) => fmtRate(statRate(q, 'ack')), 'num'],
      ['Node', (q) => q.node], ['Leader', (q) => q.leader || ''],
      ['Members', (q) => (q.members || []).join(', ')],
    ], queues, (q) => `${q.vhost}/${q.name}`));
  };
}

function queuePage(main, vhost, name) {
  const path = `/queues/${enc(vhost)}/${enc(name)}`;
  const about = el('div', { id: 'queue-details' });
  const bindings = el('div', { id: 'queue-bindings' });
  const publishResult = el('p', { id: 'publish-result' });
  const getResults = el('div', { id: 'get-results' });
  const purgeResult = el('p', { id: 'purge-result' });
  const payload = el('textarea', { id: 'publish-payload', rows: 4 });
  const persistent = el('input', { id: 'publish-persistent', type: 'checkbox' });
  const count = el('input', { id: 'get-count', type: 'number', min: 1, value: 1, size: 4 });
  const ackMode = el('select', { id: 'get-ackmode' },
    el('option', { value: 'ack_requeue_true' }, 'Nack message requeue true'),
    el('option', { value: 'ack_requeue_false' }, 'Automatic ack'),
    el('option', { value: 'reject_requeue_true' }, 'Reject requeue true'),
    el('option', { value: 'reject_requeue_false' }, 'Reject requeue false'));

  async function publish(event) {
    event.preventDefault();
    try {
      const answer = await api('POST', `/exchanges/${enc(vhost)}/amq.default/publish`, { body: {
        properties: persistent.checked ? { delivery_mode: 2 } : {},
        routing_key: name, payload: payload.value, payload_encoding: 'string' } });
      report(publishResult, answer.routed ? 'Message published.' : 'Message published, but not routed.', !answer.routed);
    } catch (error) {
      report(publishResult, error.message, true);
    }
    await refresh();
  }
  async function get(event) {
    event.preventDefault();
    try {
      const messages = await api('POST', `${path}/get`, { body: {
        count: Number(count.value) || 1, ackmode: ackMode.value, encoding: 'auto', truncate: 50000 } });
      getResults.replaceChildren(...(messages.length ? messages.map(messageView)
        : [el('p', { class: 'muted' }, 'Queue is empty.')]));
    } catch (error) {
      report(getResults, error.message, true);
    }
    await refresh();
  }
  async function purge() {
    if (!window.confirm(`Purge all ready messages of ${name}?`)) return;
    try {
      await api('DELETE', `${path}/contents`);
      report(purgeResult, 'Queue purged.');
    } catch (error) {
      report(purgeResult, error.message, true);
    }
    await refresh();
  }
  main.append(el('h1', {}, 'Queue ', el('span', { id: 'queue-name' }, name), el('span', { class: 'muted' }, ` in vhost ${vhost}`)),
    about, el('h2', {}, 'Bindings'), bindings,
    el('h2', {}, 'Publish message'),
    el('form', { class: 'inline', id: 'publish-form', onsubmit: publish },
      el('label', {}, 'Payload', payload),
      el('label', {}, persistent, ' Persistent (delivery mode 2)'),
      el('button', { type: 'submit', id: 'publish-submit' }, 'Publish message'), publishResult),
    el('h2', {}, 'Get messages'),
    el('form', { class: 'inline', id: 'get-form', onsubmit: get },
      el('label', {}, 'Ack mode ', ackMode), el('label', {}, 'Messages ', count),
      el('button', { type: 'submit', id: 'get-submit' }, 'Get messages'), getResults),
    el('h2', {}, 'Purge'),
    el('p', {}, el('button', { type: 'button', class: 'danger', id: 'purge', onclick: purge }, 'Purge messages'), purgeResult));

  async function refresh() {
    const [queue, bound] = await Promise.all([api('GET', path), api('GET', `${path}/bindings`)]);
    about.replaceChildren(details([
      ['Type', queue.type], ['Features', features(queue)],
      ['State', flagged(queue.state, queue.state !== 'running' && 'bad')],
      ['Ready', el('span', { id: 'queue-ready' }, fmtNumber(queue.messages_ready))],
      ['Unacked', fmtNumber(queue.messages_unacknowledged)],
      ['Total', el('span', { id: 'queue-messages' }, fmtNumber(queue.messages))],
      ['Consumers', fmtNumber(queue.consumers)],
      ['Incoming', fmtRate(statRate(queue, 'publish'))],
      ['Deliver / get', fmtRate(statRate(queue, 'deliver_get'))],
      ['Node', queue.node], ['Leader', queue.leader || ''], ['Members', (queue.members || []).join(', ')],
      ['Policy', queue.policy || ''], ['Arguments', JSON.stringify(queue.arguments || {})],
    ]));
    bindings.replaceChildren(table([
      ['From', (b) => b.source || '(AMQP default)'], ['Routing key', (b) => b.routing_key],
      ['Arguments', (b) => JSON.stringify(b.arguments || {})],
    ], bound));
  }
  return refresh;
}

function messageView(message, index) {
  return el('div', { class: 'message' },
    el('h3', {}, `Message ${index + 1}`),
    details([
      ['Exchange', message.exchange || '(AMQP default)'], ['Routing key', message.routing_key],
      ['Redelivered', message.redelivered ? 'yes' : 'no'], ['Left in queue', fmtNumber(message.message_count)],
      ['Properties', JSON.stringify(message.properties)],
      ['Payload', `${fmtNumber(message.payload_bytes)} bytes, encoding ${message.payload_encoding}`],
    ]),
    el('pre', { class: 'payload' }, message.payload));
}

function notFoundPage(main) {
  main.append(el('h1', {}, 'Not found'), el('p', {}, el('a', { href: '#/' }, 'Back to the overview')));
  return async () => {};
}

// ---- routing, refresh and the session ----

// #/{name}: a list page. admin.js adds its own to both tables.
const PAGES = { '': overviewPage, connections: connectionsPage, channels: channelsPage,
  exchanges: exchangesPage, queues: queuesPage };
// #/{name}/{part}/...: one object's page, with how many parts name it.
const OBJECT_PAGES = { queues: { parts: 2, page: queuePage } };

// Bumped on every navigation, so that a refresh of a page left behind stops.
let generation = 0;

function route() {
  if (!sessionStorage.getItem(AUTH_KEY)) return;
  const mine = (generation += 1);
  const parts = location.hash.replace(/^#\/?/, '').replace(/\/$/, '').split('/');
  const names = parts.slice(1);
  // Own keys only: #/constructor names no page.
  const page = Object.hasOwn(PAGES, parts[0]) ? PAGES[parts[0]] : notFoundPage;
  const object = Object.hasOwn(OBJECT_PAGES, parts[0]) ? OBJECT_PAGES[parts[0]] : null;
  const main = $('main');
  main.replaceChildren();
  let refresh;
  try {
    if (names.length === 0) {
      refresh = page(main);
    } else if (object && object.parts === names.length) {
      refresh = object.page(main, ...names.map(decodeURIComponent));
    } else {
      refresh = notFoundPage(main);
    }
  } catch (_) {
    refresh = notFoundPage(main);
  }
  for (const link of document.querySelectorAll('#nav a')) {
    link.classList.toggle('active', link.getAttribute('href') === `#/${parts[0]}`);
  }
  const tick = async () => {
    if (mine !== generation) return;
    try {
      await refresh();
      if (mine === generation) setStatus(`Updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      if (mine === generation) setStatus(error.message, true);
    }
    if (mine === generation) setTimeout(tick, REFRESH_MS);
  };
  tick();
}

function showApp() {
  $('login').hidden = true;
  $('nav').hidden = false;
  $('session').hidden = false;
  $('main').hidden = false;
  $('who').textContent = sessionStorage.getItem(USER_KEY) || '';
  for (const link of document.querySelectorAll('#nav a[data-tags]')) link.hidden = !holdsTag(link.dataset.tags);
  route();
}

function logout(reason) {
  generation += 1;
  sessionStorage.removeItem(AUTH_KEY);
  sessionStorage.removeItem(USER_KEY);
  sessionStorage.removeItem(TAGS_KEY);
  $('main').replaceChildren();
  $('main').hidden = true;
  $('nav').hidden = true;
  $('session').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = reason || '';
  setStatus('');
}

async function login(event) {
  event.preventDefault();
  const auth = basicAuth($('username').value, $('password').value);
  $('login-error').textContent = '';
  try {
    const me = await api('GET', '/whoami', { auth });
    sessionStorage.setItem(AUTH_KEY, auth);
    sessionStorage.setItem(USER_KEY, me.name);
    sessionStorage.setItem(TAGS_KEY, JSON.stringify(me.tags || []));
    $('password').value = '';
    showApp();
  } catch (error) {
    $('login-error').textContent = error.message;
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('login-form').addEventListener('submit', login);
  $('logout').addEventListener('click', () => logout(''));
  window.addEventListener('hashchange', route);
  if (sessionStorage.getItem(AUTH_KEY)) showApp(); else logout('');
});
