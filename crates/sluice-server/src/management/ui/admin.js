// Sluice management UI, the admin pages: users, virtual hosts and their
// permissions, policies, and definitions export and import. Loaded after
// app.js, whose helpers (el, api, table, details, report...) it uses and
// whose page tables it adds to. The API decides who may do what; a
// refusal is shown as the API words it.
'use strict';

// How long a downloaded file's blob URL lives after the click: the browser
// reads it after click() returns.
const DOWNLOAD_URL_LIFETIME_MS = 60000;
const TAGS_HINT = 'comma-separated: administrator, monitoring, policymaker, management';

const userHref = (name) => `#/users/${enc(name)}`;
const vhostHref = (name) => `#/vhosts/${enc(name)}`;

// A PUT: answers 'added' (201) or 'updated' (204), or throws the API's refusal.
async function put(path, body) {
  const answer = await request('PUT', path, { body });
  if (answer.status < 200 || answer.status > 299) throw new ApiError(answer.status, answer.body);
  return answer.status === 201 ? 'added' : 'updated';
}

// Runs action(), which answers what to report in `result` (the API's
// refusal is reported instead), then refreshes the page. Answers whether
// the action succeeded.
async function change(result, action, refresh) {
  let succeeded = false;
  try {
    report(result, await action());
    succeeded = true;
  } catch (error) {
    report(result, error.message, true);
  }
  try { await refresh(); } catch (error) { setStatus(error.message, true); }
  return succeeded;
}

// Deletes what `path` names once the user confirms, then goes to `back`.
async function removeThen(question, path, result, back) {
  if (!window.confirm(question)) return;
  try {
    await api('DELETE', path);
    location.hash = back;
  } catch (error) {
    report(result, error.message, true);
  }
}

// Sets a select's options from [value, label] pairs, keeping the choice.
// Left alone when they have not changed, so a refresh never resets a form.
function fillSelect(select, pairs) {
  const current = [...select.options].map((option) => option.value);
  if (current.length === pairs.length && pairs.every(([value], index) => value === current[index])) return;
  const chosen = select.value;
  select.replaceChildren(...pairs.map(([value, label]) => el('option', { value }, label)));
  if (pairs.some(([value]) => value === chosen)) select.value = chosen;
}

// rows' `value`s grouped by their `key`.
function groupBy(rows, key, value) {
  const groups = new Map();
  for (const row of rows) groups.set(row[key], [...(groups.get(row[key]) || []), row[value]]);
  return groups;
}

const tagList = (tags) => (Array.isArray(tags) ? tags.join(', ') : tags || '');

// A vhost's cluster_state: 'running', or the nodes where it is not.
function clusterState(states) {
  const down = Object.entries(states || {}).filter(([, state]) => state !== 'running');
  if (down.length === 0) return 'running';
  return down.map(([node, state]) => el('div', {}, flagged(`${state} on ${node}`, 'bad')));
}

// ---- users ----

function usersPage(main) {
  const list = el('div', { id: 'users' });
  const name = el('input', { id: 'user-name', required: true, autocomplete: 'off' });
  const password = el('input', { id: 'user-password', type: 'password', autocomplete: 'new-password' });
  const tags = el('input', { id: 'user-tags', size: 40 });
  const result = el('p', { id: 'user-result' });
  const form = el('form', { class: 'inline', id: 'user-form', onsubmit: add },
    el('label', {}, 'Name ', name),
    el('label', {}, 'Password ', password, el('span', { class: 'muted' }, ' (left empty: none, no password login)')),
    el('label', {}, 'Tags ', tags, el('span', { class: 'muted' }, ` (${TAGS_HINT})`)),
    el('button', { type: 'submit', id: 'user-submit' }, 'Add user'), result);
  main.append(el('h1', {}, 'Users'), list, el('h2', {}, 'Add a user'), form);

  async function add(event) {
    event.preventDefault();
    const user = name.value;
    const body = { tags: tags.value };
    if (password.value) body.password = password.value;
    if (await change(result, async () => `User ${user} ${await put(`/users/${enc(user)}`, body)}.`, refresh)) {
      form.reset();
    }
  }
  async function refresh() {
    const [users, permissions] = await Promise.all([api('GET', '/users'), api('GET', '/permissions')]);
    const vhosts = groupBy(permissions, 'user', 'vhost');
    list.replaceChildren(table([
      ['Name', (u) => el('a', { href: userHref(u.name) }, u.name)],
      ['Tags', (u) => tagList(u.tags)],
      ['Can access virtual hosts', (u) => (vhosts.get(u.name) || []).join(', ') || el('span', { class: 'muted' }, 'No access')],
      ['Has password', (u) => (u.password_hash ? 'yes' : 'no')],
    ], users, (u) => u.name));
  }
  return refresh;
}

function userPage(main, name) {
  const path = `/users/${enc(name)}`;
  const about = el('div', { id: 'user-details' });
  const access = el('div', { id: 'user-permissions' });
  const tags = el('input', { id: 'user-tags', size: 40 });
  const password = el('input', { id: 'user-password', type: 'password', autocomplete: 'new-password' });
  const result = el('p', { id: 'user-result' });
  const deleteResult = el('p', { id: 'user-delete-result' });
  let tagsShown = false;

  async function update(event) {
    event.preventDefault();
    const body = { tags: tags.value };
    if (password.value) body.password = password.value;
    await change(result, async () => {
      const done = await put(path, body);
      // Your own new password: the next calls log in with it.
      if (body.password !== undefined && name === sessionStorage.getItem(USER_KEY)) {
        sessionStorage.setItem(AUTH_KEY, basicAuth(name, body.password));
      }
      password.value = '';
      return `User ${name} ${done}.`;
    }, refresh);
  }
  main.append(el('h1', {}, 'User ', el('span', { id: 'user-name-shown' }, name)), about,
    el('h2', {}, 'Permissions'), access,
    el('h2', {}, 'Update this user'),
    el('form', { class: 'inline', id: 'user-form', onsubmit: update },
      el('label', {}, 'Tags ', tags, el('span', { class: 'muted' }, ` (${TAGS_HINT})`)),
      el('label', {}, 'New password ', password, el('span', { class: 'muted' }, ' (left empty: unchanged)')),
      el('button', { type: 'submit', id: 'user-submit' }, 'Update user'), result),
    el('h2', {}, 'Delete this user'),
    el('p', {}, el('button', { type: 'button', class: 'danger', id: 'user-delete',
      onclick: () => removeThen(`Delete user ${name}?`, path, deleteResult, '#/users') }, 'Delete user'), deleteResult));

  async function refresh() {
    const [user, permissions] = await Promise.all([api('GET', path), api('GET', `${path}/permissions`)]);
    about.replaceChildren(details([
      ['Tags', el('span', { id: 'user-tags-shown' }, tagList(user.tags))],
      ['Has password', user.password_hash ? 'yes' : 'no'],
    ]));
    if (!tagsShown) { tags.value = tagList(user.tags); tagsShown = true; }
    access.replaceChildren(table([
      ['Virtual host', (p) => el('a', { href: vhostHref(p.vhost) }, p.vhost)],
      ['Configure', (p) => p.configure], ['Write', (p) => p.write], ['Read', (p) => p.read],
    ], permissions, (p) => p.vhost));
  }
  return refresh;
}

// ---- virtual hosts and their permissions ----

function vhostsPage(main) {
  const list = el('div', { id: 'vhosts' });
  const name = el('input', { id: 'vhost-name', required: true, autocomplete: 'off' });
  const result = el('p', { id: 'vhost-result' });
  const form = el('form', { class: 'inline', id: 'vhost-form', onsubmit: add },
    el('label', {}, 'Name ', name),
    el('button', { type: 'submit', id: 'vhost-submit' }, 'Add virtual host'), result);
  main.append(el('h1', {}, 'Virtual hosts'), list, el('h2', {}, 'Add a virtual host'), form);

  async function add(event) {
    event.preventDefault();
    const vhost = name.value;
    if (await change(result, async () => `Virtual host ${vhost} ${await put(`/vhosts/${enc(vhost)}`)}.`, refresh)) {
      form.reset();
    }
  }
  async function refresh() {
    const [vhosts, permissions] = await Promise.all([api('GET', '/vhosts'), api('GET', '/permissions')]);
    const users = groupBy(permissions, 'vhost', 'user');
    list.replaceChildren(table([
      ['Name', (v) => el('a', { href: vhostHref(v.name) }, v.name)],
      ['Users', (v) => (users.get(v.name) || []).join(', ')],
      ['State', (v) => clusterState(v.cluster_state)],
      ['Publish', (v) => fmtRate(statRate(v, 'publish')), 'num'],
      ['Deliver / get', (v) => fmtRate(statRate(v, 'deliver_get')), 'num'],
    ], vhosts, (v) => v.name));
  }
  return refresh;
}

function vhostPage(main, name) {
  const path = `/vhosts/${enc(name)}`;
  const about = el('div', { id: 'vhost-details' });
  const access = el('div', { id: 'vhost-permissions' });
  const user = el('select', { id: 'permission-user', required: true });
  const [configure, write, read] = ['configure', 'write', 'read'].map((kind) =>
    el('input', { id: `permission-${kind}`, value: '.*' }));
  const result = el('p', { id: 'permission-result' });
  const deleteResult = el('p', { id: 'vhost-delete-result' });
  const permissionPath = (who) => `/permissions/${enc(name)}/${enc(who)}`;

  async function set(event) {
    event.preventDefault();
    const who = user.value;
    const body = { configure: configure.value, write: write.value, read: read.value };
    await change(result, async () => `Permission of ${who} ${await put(permissionPath(who), body)}.`, refresh);
  }
  async function clear(permission) {
    if (!window.confirm(`Clear the permission of ${permission.user} in ${name}?`)) return;
    await change(result, async () => {
      await api('DELETE', permissionPath(permission.user));
      return `Permission of ${permission.user} cleared.`;
    }, refresh);
  }
  main.append(el('h1', {}, 'Virtual host ', el('span', { id: 'vhost-name-shown' }, name)), about,
    el('h2', {}, 'Permissions'), access,
    el('h2', {}, 'Set permission'),
    el('form', { class: 'inline', id: 'permission-form', onsubmit: set },
      el('label', {}, 'User ', user),
      el('label', {}, 'Configure regexp ', configure), el('label', {}, 'Write regexp ', write),
      el('label', {}, 'Read regexp ', read),
      el('button', { type: 'submit', id: 'permission-submit' }, 'Set permission'), result),
    el('h2', {}, 'Delete this virtual host'),
    el('p', {}, el('button', { type: 'button', class: 'danger', id: 'vhost-delete',
      onclick: () => removeThen(`Delete virtual host ${name} and everything in it?`, path, deleteResult, '#/vhosts') },
    'Delete virtual host'), deleteResult));

  async function refresh() {
    const [vhost, permissions, users] = await Promise.all([
      api('GET', path), api('GET', `${path}/permissions`), api('GET', '/users')]);
    about.replaceChildren(details([
      ['State', clusterState(vhost.cluster_state)],
      ['Publish', fmtRate(statRate(vhost, 'publish'))],
      ['Deliver / get', fmtRate(statRate(vhost, 'deliver_get'))],
    ]));
    access.replaceChildren(table([
      ['User', (p) => el('a', { href: userHref(p.user) }, p.user)],
      ['Configure', (p) => p.configure], ['Write', (p) => p.write], ['Read', (p) => p.read],
      ['', (p) => el('button', { type: 'button', class: 'danger', onclick: () => clear(p) }, 'Clear')],
    ], permissions, (p) => p.user));
    fillSelect(user, users.map((u) => [u.name, u.name]));
  }
  return refresh;
}

// ---- policies ----

// A definition's value as the form and the list write it: text as it is,
// anything else (numbers, booleans, lists, text that reads as one) as JSON.
function definitionValue(value) {
  if (typeof value !== 'string') return JSON.stringify(value);
  try { JSON.parse(value); } catch (_) { return value; }
  return JSON.stringify(value);
}

// The definition field: a JSON object, or one key=value a line whose
// value is read as JSON when it is JSON (10, true, ["a"], "10") and as
// text otherwise (reject-publish).
function parseDefinition(text) {
  if (text.trim().startsWith('{')) {
    try { return JSON.parse(text); } catch (error) { throw new Error(`Definition: ${error.message}`); }
  }
  const definition = {};
  for (const line of text.split('\n').map((each) => each.trim()).filter(Boolean)) {
    const equals = line.indexOf('=');
    if (equals < 1) throw new Error(`Definition: "${line}" is not key=value`);
    const value = line.slice(equals + 1).trim();
    try { definition[line.slice(0, equals).trim()] = JSON.parse(value); } catch (_) {
      definition[line.slice(0, equals).trim()] = value;
    }
  }
  return definition;
}

// RabbitMQ's API sends a policy's validation texts HTML-escaped
// (&lt;&lt;"x"&gt;&gt;); shown as text, they read better unescaped.
const unescapeHtml = (text) => text.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');

function policiesPage(main) {
  const mayChange = holdsTag('administrator policymaker');
  const list = el('div', { id: 'policies' });
  const vhost = el('select', { id: 'policy-vhost', required: true });
  const name = el('input', { id: 'policy-name', required: true, autocomplete: 'off' });
  const pattern = el('input', { id: 'policy-pattern', required: true, size: 40 });
  const applyTo = el('select', { id: 'policy-apply-to' },
    el('option', { value: 'all' }, 'Exchanges and queues'), el('option', { value: 'exchanges' }, 'Exchanges'),
    el('option', { value: 'queues' }, 'Queues'));
  const priority = el('input', { id: 'policy-priority', type: 'number', value: 0, size: 4 });
  const definition = el('textarea', { id: 'policy-definition', rows: 4 });
  const result = el('p', { id: 'policy-result' });
  main.append(el('h1', {}, 'Policies'), list);
  if (mayChange) {
    main.append(el('h2', {}, 'Add or update a policy'),
      el('form', { class: 'inline', id: 'policy-form', onsubmit: save },
        el('label', {}, 'Virtual host ', vhost), el('label', {}, 'Name ', name),
        el('label', {}, 'Pattern ', pattern), el('label', {}, 'Apply to ', applyTo),
        el('label', {}, 'Priority ', priority),
        el('label', {}, 'Definition', el('span', { class: 'muted' },
          ' (one key=value a line, such as max-length=1000, values read as JSON where they are; or a JSON object)'),
        definition),
        el('button', { type: 'submit', id: 'policy-submit' }, 'Save policy'), result));
  }

  async function save(event) {
    event.preventDefault();
    const target = `/policies/${enc(vhost.value)}/${enc(name.value)}`;
    const label = name.value;
    await change(result, async () => {
      const body = { pattern: pattern.value, 'apply-to': applyTo.value,
        priority: priority.value === '' ? 0 : Number(priority.value), definition: parseDefinition(definition.value) };
      try {
        return `Policy ${label} ${await put(target, body)}.`;
      } catch (error) {
        throw new Error(unescapeHtml(error.message));
      }
    }, refresh);
  }
  function edit(policy) {
    vhost.value = policy.vhost;
    name.value = policy.name;
    pattern.value = policy.pattern;
    applyTo.value = policy['apply-to'];
    priority.value = policy.priority;
    definition.value = Object.entries(policy.definition || {})
      .map(([key, value]) => `${key}=${definitionValue(value)}`).join('\n');
    name.focus();
  }
  async function remove(policy) {
    if (!window.confirm(`Delete policy ${policy.name} in ${policy.vhost}?`)) return;
    await change(result, async () => {
      await api('DELETE', `/policies/${enc(policy.vhost)}/${enc(policy.name)}`);
      return `Policy ${policy.name} deleted.`;
    }, refresh);
  }
  async function refresh() {
    const [policies, vhosts] = await Promise.all([api('GET', '/policies'), mayChange ? api('GET', '/vhosts') : []]);
    const actions = (p) => [el('button', { type: 'button', onclick: () => edit(p) }, 'Edit'),
      el('button', { type: 'button', class: 'danger', onclick: () => remove(p) }, 'Delete')];
    list.replaceChildren(table([
      ['Vhost', (p) => p.vhost], ['Name', (p) => p.name], ['Pattern', (p) => p.pattern],
      ['Apply to', (p) => p['apply-to']],
      ['Definition', (p) => Object.entries(p.definition || {})
        .map(([key, value]) => el('div', {}, `${key}: ${definitionValue(value)}`))],
      ['Priority', (p) => p.priority, 'num'],
      ...(mayChange ? [['', actions]] : []),
    ], policies, (p) => `${p.vhost}/${p.name}`));
    fillSelect(vhost, vhosts.map((v) => [v.name, v.name]));
  }
  return refresh;
}

// ---- definitions ----

// "3 users, 2 vhosts, ...": the lists a definitions file holds.
function definitionsSummary(definitions) {
  return Object.entries(definitions).filter(([, value]) => Array.isArray(value))
    .map(([key, value]) => `${value.length} ${key.replace(/_/g, ' ')}`).join(', ');
}

function definitionsPage(main) {
  const vhost = el('select', { id: 'export-vhost' }, el('option', { value: '' }, 'All'));
  const date = new Date().toISOString().slice(0, 10);
  const filename = el('input', { id: 'export-filename', size: 40, required: true, value: `sluice_definitions_${date}.json` });
  const exportResult = el('p', { id: 'export-result' });
  const file = el('input', { id: 'import-file', type: 'file', accept: '.json,application/json', required: true });
  const importResult = el('p', { id: 'import-result' });

  async function download(event) {
    event.preventDefault();
    const path = vhost.value ? `/definitions/${enc(vhost.value)}` : '/definitions';
    const saveAs = filename.value;
    await change(exportResult, async () => {
      const definitions = await api('GET', path);
      const blob = new Blob([JSON.stringify(definitions, null, 2)], { type: 'application/json' });
      const url = URL.createObjectURL(blob);
      el('a', { href: url, download: saveAs }).click();
      setTimeout(() => URL.revokeObjectURL(url), DOWNLOAD_URL_LIFETIME_MS);
      return `Downloaded ${saveAs}: ${definitionsSummary(definitions)}.`;
    }, refresh);
  }
  async function upload(event) {
    event.preventDefault();
    const chosen = file.files[0];
    if (!chosen) return;
    await change(importResult, async () => {
      await api('POST', '/definitions', { text: await chosen.text() });
      return `Imported ${chosen.name}.`;
    }, refresh);
  }
  main.append(el('h1', {}, 'Definitions'),
    el('p', { class: 'muted' }, "Users, virtual hosts, permissions, policies, parameters, exchanges, queues and "
      + "bindings, in RabbitMQ's definitions format (rabbitmqctl export_definitions, load_definitions)."),
    el('h2', {}, 'Export'),
    el('form', { class: 'inline', id: 'export-form', onsubmit: download },
      el('label', {}, 'Virtual host ', vhost), el('label', {}, 'File name ', filename),
      el('button', { type: 'submit', id: 'export-submit' }, 'Download definitions'), exportResult),
    el('h2', {}, 'Import'),
    el('form', { class: 'inline', id: 'import-form', onsubmit: upload },
      el('label', {}, 'Definitions file ', file),
      el('button', { type: 'submit', id: 'import-submit' }, 'Upload definitions'), importResult));

  async function refresh() {
    const vhosts = await api('GET', '/vhosts');
    fillSelect(vhost, [['', 'All'], ...vhosts.map((v) => [v.name, v.name])]);
  }
  return refresh;
}

Object.assign(PAGES, { users: usersPage, vhosts: vhostsPage, policies: policiesPage, definitions: definitionsPage });
Object.assign(OBJECT_PAGES, { users: { parts: 1, page: userPage }, vhosts: { parts: 1, page: vhostPage } });
