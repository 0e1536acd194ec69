// SPDX-License-Identifier: Apache-2.0
// The vrdma console's pages: a hash router (#/, #/vm/NAME, #/host/ID,
// #/live) over the console's JSON API. Text from the API goes into the
// page only as text nodes, never as HTML.
'use strict';

const main = document.getElementById('main');
let timer = null; // the live view's poll

// h builds an element: h('a', {href: '#/'}, 'text', child...).
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === null || v === undefined) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

// api calls the console's API; a body makes it a write.
async function api(path, body) {
  const opt = { credentials: 'same-origin', headers: {} };
  if (body !== undefined) {
    opt.method = 'POST';
    opt.headers['Content-Type'] = 'application/json';
    opt.headers['X-Vrdma-Console'] = '1';
    opt.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, opt);
  } catch (e) {
    return { ok: false, status: 0, data: { error: 'the console does not answer: ' + e.message } };
  }
  let data = {};
  try { data = await r.json(); } catch (e) { data = { error: 'bad answer: ' + e.message }; }
  return { ok: r.ok, status: r.status, data };
}

function show(title, ...kids) {
  document.title = title + ' · vrdma console';
  main.replaceChildren(...kids.flat().filter(k => k !== null && k !== undefined && k !== false));
}

function errorBox(msg) {
  return h('p', { class: 'msg error', role: 'alert' }, msg);
}

function power(p) {
  const on = p === 'poweredOn';
  return h('span', { class: 'badge ' + (on ? 'on' : 'off') }, on ? 'powered on' : p === 'poweredOff' ? 'powered off' : (p || 'unknown'));
}

function secs(s) {
  if (!s) return '–';
  if (s < 120) return s.toFixed(0) + ' s';
  if (s < 7200) return (s / 60).toFixed(0) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

function vmItem(v) {
  const ads = (v.adapters || []).map(a => a.name + (a.portgroup ? ' on ' + a.portgroup : '')).join(', ');
  return h('li', { 'data-name': v.name },
    h('a', { href: '#/vm/' + encodeURIComponent(v.name) }, v.name), ' ', power(v.power), ' ',
    h('span', { class: 'attrs' }, ads ? 'adapters: ' + ads : 'no PVRDMA adapter'));
}

function hostItem(ho) {
  return h('li', { 'data-name': ho.name },
    h('a', { href: '#/host/' + encodeURIComponent(ho.id) }, 'Host ' + ho.name), ' ',
    h('span', { class: 'badge ' + ho.state }, ho.state), ' ',
    h('span', { class: 'attrs' }, 'lease ' + secs(ho.lease_age_s) + ' · uplinks: ' + (ho.uplinks.length ? ho.uplinks.join(', ') : 'none')),
    ho.vms.length ? h('ul', {}, ho.vms.map(vmItem)) : null);
}

// filter hides the tree's named items that neither match q nor hold one
// that does.
function filter(root, q) {
  q = q.trim().toLowerCase();
  const walk = li => {
    let keep = !q || (li.dataset.name || '').toLowerCase().includes(q);
    for (const c of li.querySelectorAll(':scope > ul > li, :scope > details > ul > li')) {
      if (walk(c)) keep = true;
    }
    li.hidden = !keep;
    if (keep && q) { const d = li.querySelector(':scope > details'); if (d) d.open = true; }
    return keep;
  };
  for (const li of root.querySelectorAll(':scope > li')) walk(li);
}

async function inventory() {
  const r = await api('/api/inventory');
  if (!r.ok) return show('Inventory', h('h1', {}, 'Inventory'), errorBox(r.data.error));
  const inv = r.data;
  const tree = h('ul', { class: 'tree', 'aria-label': 'Switches, port groups, hosts and VMs' });
  for (const sw of inv.switches) {
    tree.append(h('li', { 'data-name': sw.name }, h('details', { open: true },
      h('summary', {}, 'Switch ' + sw.name, ' ', h('span', { class: 'attrs' }, 'MTU ' + sw.mtu + ' · network policy ' + sw.network_policy)),
      h('div', { class: 'row' }, h('a', { href: '#/switch/' + encodeURIComponent(sw.name) }, 'Settings of switch ' + sw.name),
        deleteButton('switch', sw.name, '/api/switches/' + encodeURIComponent(sw.name) + '/delete')),
      h('ul', {}, sw.portgroups.map(pg => h('li', { 'data-name': pg.key + ' ' + pg.name }, h('details', { open: true },
        h('summary', {}, 'Port group ' + pg.key + (pg.name && pg.name !== pg.key ? ' (' + pg.name + ')' : ''), ' ',
          h('span', { class: 'attrs' }, 'VLAN ' + pg.vlan + ' · PFC priority ' + pg.pfc_priority + ' · DSCP ' + pg.dscp + ' · RoCE ' + pg.roce_version + (pg.subnet ? ' · ' + pg.subnet : ''))),
        h('div', { class: 'row' }, h('a', { href: '#/portgroup/' + encodeURIComponent(pg.key) }, 'Settings of port group ' + pg.key),
          deleteButton('port group', pg.key, '/api/portgroups/' + encodeURIComponent(pg.key) + '/delete')),
        h('ul', {}, pg.hosts.map(hostItem)))))))));
  }
  if (inv.unplaced.length) {
    tree.append(h('li', { 'data-name': '' }, h('details', { open: true }, h('summary', {}, 'VMs on no port group'), h('ul', {}, inv.unplaced.map(hostItem)))));
  }
  if (!inv.control) {
    tree.append(h('li', { 'data-name': inv.local_host }, h('details', { open: true },
      h('summary', {}, 'This agent\u2019s host ' + (inv.local_host || '')), h('ul', {}, inv.local.map(vmItem)))));
  }
  const search = h('input', { type: 'search', id: 'search', placeholder: 'VM, host, port group…', oninput: e => filter(tree, e.target.value) });
  show('Inventory', h('h1', {}, 'Inventory'),
    inv.control ? null : h('p', { class: 'msg' }, 'No control plane (' + inv.control_error + '): the local agent\u2019s VMs only.'),
    inv.local_error ? errorBox(inv.local_error) : null,
    h('div', { class: 'row', role: 'search' }, h('label', { for: 'search' }, 'Search by name'), search),
    h('div', { id: 'admin-result', role: 'status', 'aria-live': 'polite' }),
    tree, createForms(inv));
}

// adminResult shows a create's or delete's outcome in the inventory
// page's status region (after the page is drawn again).
function adminResult(...kids) {
  const out = document.getElementById('admin-result');
  if (out) out.replaceChildren(...kids);
}

// adminWrite posts body to path; on success it draws the inventory again
// and says done, on a refusal it says why.
async function adminWrite(path, body, done) {
  adminResult(h('p', { class: 'msg' }, 'Working…'));
  const res = await api(path, body);
  if (!res.ok) return adminResult(errorBox('Refused: ' + res.data.error));
  await inventory();
  adminResult(h('p', { class: 'msg ok' }, done));
}

// deleteButton deletes an object of the control plane (vrdmactl switch
// delete, portgroup delete), which is refused while something is on it.
function deleteButton(what, name, path) {
  return h('button', { type: 'button', class: 'delete', 'data-delete': what + ' ' + name, onclick: () => adminWrite(path, {}, what[0].toUpperCase() + what.slice(1) + ' ' + name + ' deleted.') }, 'Delete ' + what + ' ' + name);
}

// field is a labelled input (or select) in a create form.
function field(id, label, input) {
  input.id = id;
  return h('div', { class: 'row' }, h('label', { for: id }, label), input);
}

// createForms are the forms that create VMs, switches and port groups.
function createForms(inv) {
  const val = id => document.getElementById(id).value.trim();
  const num = id => Number(val(id));
  const submit = (fn) => ev => { ev.preventDefault(); fn(); };
  const opts = xs => xs.map(([v, t]) => h('option', { value: v }, t));
  return h('section', { 'aria-labelledby': 'create-h' }, h('h2', { id: 'create-h' }, 'Create'),
    h('details', {}, h('summary', {}, 'New virtual machine'),
      h('form', { id: 'new-vm', onsubmit: submit(() => adminWrite('/api/vms', { name: val('vm-name'), memory_mb: num('vm-mem'), guest_os: val('vm-guest'), hw_version: num('vm-hw'), host: val('vm-host') },
        'VM ' + val('vm-name') + ' created, powered off, with no adapter yet: open it to add a PVRDMA adapter.')) },
        field('vm-name', 'Name', h('input', { type: 'text', required: true })),
        field('vm-mem', 'Memory (MB)', h('input', { type: 'number', min: 1, value: 1024, required: true })),
        field('vm-guest', 'Guest OS', h('input', { type: 'text', value: 'ubuntu-64', required: true })),
        field('vm-hw', 'Virtual hardware version', h('input', { type: 'number', min: 1, value: 20, required: true })),
        field('vm-host', 'Host', h('select', {}, h('option', { value: '' }, 'this agent\u2019s host'), opts(inv.hosts.map(x => [x.id, x.name])))),
        h('button', { type: 'submit', class: 'primary' }, 'Create VM'))),
    inv.control ? [
      h('details', {}, h('summary', {}, 'New distributed switch'),
        h('form', { id: 'new-switch', onsubmit: submit(() => adminWrite('/api/switches', { name: val('sw-name'), mtu: num('sw-mtu'), uplink_policy: val('sw-policy') }, 'Switch ' + val('sw-name') + ' created.')) },
          field('sw-name', 'Name', h('input', { type: 'text', required: true })),
          field('sw-mtu', 'MTU', h('input', { type: 'number', min: 1280, max: 9000, value: 9000, required: true })),
          field('sw-policy', 'Uplink policy', h('select', {}, opts([['single', 'single'], ['failover', 'failover']]))),
          h('button', { type: 'submit', class: 'primary' }, 'Create switch'))),
      h('details', {}, h('summary', {}, 'New distributed port group'),
        h('form', { id: 'new-pg', onsubmit: submit(() => adminWrite('/api/portgroups', { key: val('pg-key'), name: val('pg-name'), switch: val('pg-switch'), vlan: num('pg-vlan'),
          pfc_priority: num('pg-pfc'), dscp: num('pg-dscp'), roce_version: val('pg-roce'), subnet: val('pg-subnet') }, 'Port group ' + val('pg-key') + ' created.')) },
          field('pg-key', 'Key', h('input', { type: 'text', required: true, placeholder: 'dvportgroup-80' })),
          field('pg-name', 'Name', h('input', { type: 'text', placeholder: 'the key' })),
          field('pg-switch', 'Switch', h('select', {}, opts(inv.switches.map(x => [x.name, x.name])))),
          field('pg-vlan', 'VLAN (0: untagged)', h('input', { type: 'number', min: 0, max: 4094, value: 0, required: true })),
          field('pg-pfc', 'PFC priority', h('input', { type: 'number', min: 0, max: 7, value: 3, required: true })),
          field('pg-dscp', 'DSCP', h('input', { type: 'number', min: 0, max: 63, value: 26, required: true })),
          field('pg-roce', 'RoCE version', h('select', {}, opts([['v2', 'RoCE v2'], ['v1', 'RoCE v1']]))),
          field('pg-subnet', 'Subnet (optional)', h('input', { type: 'text', placeholder: '10.1.0.0/24' })),
          h('button', { type: 'submit', class: 'primary' }, 'Create port group')))] : null);
}

function findingList(fs) {
  return h('ul', { class: 'findings' }, fs.map(f => h('li', { class: f.severity },
    h('span', { class: 'sev' }, f.severity), h('code', {}, f.rule), f.key ? ' ' : '', f.key ? h('code', {}, f.key) : null, ': ', f.message)));
}

// vmPage is the VM's summary, power buttons and Edit Settings.
async function vmPage(name) {
  const r = await api('/api/vms/' + encodeURIComponent(name));
  if (!r.ok) return show('VM ' + name, h('h1', {}, 'VM ' + name), errorBox(r.data.error));
  const p = r.data, vm = p.vm;
  const on = vm.power === 'poweredOn';
  const out = h('div', { id: 'power-result', role: 'status', 'aria-live': 'polite' });
  const powerOp = async (op) => {
    out.replaceChildren(h('p', { class: 'msg' }, op === 'power-on' ? 'Powering on…' : 'Powering off…'));
    const res = await api('/api/vms/' + encodeURIComponent(name) + '/' + op, op === 'power-on' && hostSel.value ? { host: hostSel.value } : {});
    if (!res.ok) return out.replaceChildren(errorBox(res.data.error));
    if (res.data.refused) {
      const errs = res.data.findings.filter(f => f.severity === 'error');
      return out.replaceChildren(h('p', { class: 'msg error', role: 'alert' }, 'Power on refused by the rules: ' + errs.length + (errs.length === 1 ? ' error' : ' errors')), findingList(res.data.findings));
    }
    await vmPage(name);
    document.getElementById('power-result').replaceChildren(h('p', { class: 'msg ok' },
      op === 'power-on' ? 'VM ' + name + ' powered on on host ' + res.data.vm.host : 'VM ' + name + ' powered off' + (res.data.detached ? '; its workload was detached' : '')),
      res.data.findings && res.data.findings.length ? findingList(res.data.findings) : '');
  };

  const hostSel = h('select', { id: 'on-host' }, h('option', { value: '' }, vm.host ? 'where it is registered (' + vm.host + ')' : 'this agent\u2019s host'),
    vm.managed ? p.hosts.map(x => h('option', { value: x.id }, x.name + ' (' + x.state + ')')) : []);
  // Edit Settings: what the form holds becomes one vrdma.VMEdit.
  const pgSelect = h('select', { id: 'pg' }, p.portgroups.map(g => h('option', { value: g.key }, g.key + (g.name && g.name !== g.key ? ' (' + g.name + ')' : '') + ' · ' + g.switch + ' · VLAN ' + g.vlan)));
  const pending = h('ul', { id: 'pending-adapters' });
  const adds = [], removes = [];
  const reserve = h('input', { type: 'checkbox', id: 'reserve', checked: p.memory_reserved, disabled: p.memory_reserved });
  const rows = h('tbody', {});
  const checks = h('div', { id: 'checks', role: 'status', 'aria-live': 'polite' });
  const saved = h('div', { id: 'save-result', role: 'status', 'aria-live': 'polite' });
  const edit = () => {
    const e = {};
    if (removes.length) e.remove_adapters = removes;
    if (adds.length) e.add_adapters = adds.map(k => ({ portgroup: k }));
    const set = [...rows.querySelectorAll('tr')].map(tr => ({ key: tr.querySelector('.k').value.trim(), value: tr.querySelector('.v').value })).filter(kv => kv.key);
    if (set.length) e.set = set;
    if (reserve.checked && !p.memory_reserved) e.reserve_all_memory = true;
    return e;
  };
  let seq = 0;
  const check = async () => {
    const e = edit(), mine = ++seq;
    if (!Object.keys(e).length) return checks.replaceChildren(h('p', { class: 'muted' }, 'No change yet. The rules are checked here before you save.'));
    const res = await api('/api/vms/' + encodeURIComponent(name) + '/edit', Object.assign({ dry_run: true }, e));
    if (mine !== seq) return;
    if (!res.ok) return checks.replaceChildren(h('p', { class: 'msg error', role: 'alert' }, 'Cannot save: ' + res.data.error));
    if (res.data.refused) return checks.replaceChildren(h('p', { class: 'msg error' }, 'Saving would be refused: the change breaks ' + res.data.findings.length + ' rules'), findingList(res.data.findings));
    const errs = res.data.findings.filter(f => f.severity === 'error');
    checks.replaceChildren(h('p', { class: 'msg ok' }, 'The rules accept this change.' + (errs.length ? ' Still to fix before power-on: ' + errs.length + '.' : '')), findingList(res.data.findings));
  };
  const addRow = (k, v) => {
    const n = rows.children.length;
    const tr = h('tr', {},
      h('td', {}, h('label', { class: 'muted', for: 'k' + n }, 'Key '), h('input', { type: 'text', class: 'k', id: 'k' + n, value: k || '', placeholder: 'vrdma.asyncMode', oninput: check })),
      h('td', {}, h('label', { class: 'muted', for: 'v' + n }, 'Value '), h('input', { type: 'text', class: 'v', id: 'v' + n, value: v || '', placeholder: 'TRUE', oninput: check })),
      h('td', {}, h('button', { type: 'button', onclick: () => { tr.remove(); check(); } }, 'Remove row')));
    rows.append(tr);
    tr.querySelector('.k').focus();
  };
  reserve.addEventListener('change', check);
  const form = h('form', { id: 'edit', 'aria-labelledby': 'edit-h', onsubmit: async ev => {
    ev.preventDefault();
    const e = edit();
    if (!Object.keys(e).length) return saved.replaceChildren(h('p', { class: 'msg' }, 'Nothing to save.'));
    const res = await api('/api/vms/' + encodeURIComponent(name) + '/edit', e);
    if (!res.ok) return saved.replaceChildren(errorBox('Not saved: ' + res.data.error));
    if (res.data.refused) return saved.replaceChildren(h('p', { class: 'msg error', role: 'alert' }, 'Not saved: the change breaks ' + res.data.findings.length + ' rules'), findingList(res.data.findings));
    await vmPage(name);
    document.getElementById('save-result').replaceChildren(h('p', { class: 'msg ok' }, 'Saved.'));
  } },
    h('h2', { id: 'edit-h' }, 'Edit Settings'),
    on ? h('p', { class: 'msg', id: 'on-note' }, 'The VM is powered on: its settings change only once it is powered off (the checks below say so too).') : null,
    h('fieldset', {}, h('legend', {}, 'Virtual Hardware: network adapters'),
      p.adapters.length ? h('ul', { id: 'adapters' }, p.adapters.map(a => {
        const n = a.name.replace('vrdma', '') * 1;
        const conn = c => h('button', { type: 'button', class: c ? 'connect' : 'disconnect', onclick: async () => {
          const res = await api('/api/vms/' + encodeURIComponent(name) + '/connect', { adapter: a.name, connected: c });
          if (!res.ok) return saved.replaceChildren(errorBox(res.data.error));
          saved.replaceChildren(h('p', { class: 'msg ok' }, 'Adapter ' + a.name + (res.data.changed ? '' : ' was already') + (c ? ' connected' : ' disconnected') + '; ' + res.data.workloads + ' workloads told.'));
        } }, (c ? 'Connect ' : 'Disconnect ') + a.name);
        const li = h('li', {}, 'Network adapter ' + (n + 1) + ' (' + a.name + '): PVRDMA on ' + (a.portgroup || 'no port group') + (a.start_connected ? '' : ', not connected at power on') + ' ',
          on ? [conn(false), ' ', conn(true), ' '] : null,
          h('button', { type: 'button', 'aria-label': 'Remove network adapter ' + (n + 1), onclick: ev => {
            removes.push(n);
            ev.target.replaceWith(h('em', {}, '(removed when you save)'));
            check();
          } }, 'Remove'));
        return li;
      })) : h('p', { class: 'muted' }, 'No PVRDMA adapter.'),
      pending,
      p.portgroups.length ? h('div', { class: 'row' }, h('label', { for: 'pg' }, 'Distributed port group'), pgSelect,
        h('button', { type: 'button', id: 'add-adapter', onclick: () => {
          adds.push(pgSelect.value);
          pending.append(h('li', {}, 'New network adapter: PVRDMA on ' + pgSelect.value + ' (not saved yet)'));
          check();
        } }, 'Add PVRDMA adapter')) : h('p', { class: 'muted' }, 'No port group in the control plane to add an adapter on (vrdmactl portgroup create).')),
    h('fieldset', {}, h('legend', {}, 'Memory'),
      h('p', {}, 'memSize ' + p.mem_size_mb + ' MB'),
      h('div', { class: 'row' }, reserve, h('label', { for: 'reserve' }, 'Reserve all guest memory (All locked)'))),
    h('fieldset', {}, h('legend', {}, 'VM Options: advanced configuration parameters'),
      h('div', { class: 'scroll' }, h('table', {}, h('tbody', {}, rows))),
      h('button', { type: 'button', id: 'add-row', onclick: () => addRow() }, 'Add configuration parameter'),
      h('details', {}, h('summary', {}, 'Current parameters (' + p.params.length + ')'),
        h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'Key'), h('th', {}, 'Value'))),
          h('tbody', {}, p.params.map(kv => h('tr', {}, h('td', {}, h('code', {}, kv.key)), h('td', {}, h('code', {}, kv.value))))))))),
    h('h3', {}, 'Rule checks'), checks,
    h('div', { class: 'row' }, h('button', { type: 'submit', class: 'primary', id: 'save' }, 'Save')), saved);

  show('VM ' + name,
    h('h1', {}, 'VM ' + name, ' ', power(vm.power)),
    h('p', {}, vm.host ? ['Host ', vm.host_id ? h('a', { href: '#/host/' + encodeURIComponent(vm.host_id) }, vm.host) : vm.host] : 'No host',
      ' · ' + (vm.managed ? 'managed (control plane)' : 'defined on its host') + ' · owner uid ' + vm.owner.uid),
    h('div', { class: 'row' },
      on ? null : [h('label', { for: 'on-host' }, 'Host'), hostSel],
      h('button', { type: 'button', id: 'power-on', disabled: on, onclick: () => powerOp('power-on') }, 'Power on'),
      h('button', { type: 'button', id: 'power-off', disabled: !on, onclick: () => powerOp('power-off') }, 'Power off'),
      h('button', { type: 'button', id: 'delete-vm', onclick: async () => {
        const res = await api('/api/vms/' + encodeURIComponent(name) + '/delete', {});
        if (!res.ok) return out.replaceChildren(errorBox('Not deleted: ' + res.data.error));
        history.pushState(null, '', '#/'); // no hashchange: the inventory is drawn here, once
        await route();
        adminResult(h('p', { class: 'msg ok' }, 'VM ' + name + ' deleted.'));
      } }, 'Delete VM')),
    out,
    p.config_error ? errorBox('The VMX: ' + p.config_error) : null,
    p.findings.length ? [h('h2', {}, 'What the rules say now'), findingList(p.findings)] : null,
    form);
  check();
}

async function hostPage(id) {
  const r = await api('/api/hosts/' + encodeURIComponent(id));
  if (!r.ok) return show('Host', h('h1', {}, 'Host'), errorBox(r.data.error));
  const p = r.data, ho = p.host;
  const out = h('div', { id: 'configure-result', role: 'status', 'aria-live': 'polite' });
  const box = (id, label, checked) => h('div', { class: 'row check' }, h('input', { type: 'checkbox', id, checked }), h('label', { for: id }, label));
  // Configure sends only what changed, as vrdmactl host configure's flags.
  const form = h('form', { id: 'configure', 'aria-labelledby': 'configure-h', onsubmit: async ev => {
    ev.preventDefault();
    const c = {}, v = id => document.getElementById(id);
    if (v('cf-addr').value.trim() !== (p.pvrdma_address || '')) c.pvrdma_address = v('cf-addr').value.trim() || 'none';
    if (v('cf-vmknic').value.trim() !== (p.pvrdma_vmknic || '')) c.vmknic = v('cf-vmknic').value.trim();
    if (v('cf-fw').checked !== p.firewall_pvrdma) c.firewall_pvrdma = v('cf-fw').checked;
    if (v('cf-ns').checked !== p.pvrdma_namespaces) c.pvrdma_namespaces = v('cf-ns').checked;
    if (v('cf-maint').checked !== p.maintenance) c.maintenance = v('cf-maint').checked;
    if (!Object.keys(c).length) return out.replaceChildren(h('p', { class: 'msg' }, 'Nothing changed.'));
    const res = await api('/api/hosts/' + encodeURIComponent(id) + '/configure', c);
    if (!res.ok) return out.replaceChildren(errorBox('Not configured: ' + res.data.error));
    await hostPage(id);
    document.getElementById('configure-result').replaceChildren(h('p', { class: 'msg ok' }, 'Host ' + ho.name + ' configured: ' + Object.keys(c).join(', ') + '.'));
  } },
    h('h2', { id: 'configure-h' }, 'Configure for PVRDMA'),
    h('p', { class: 'muted' }, 'Tag the address that carries PVRDMA traffic between hosts and enable the pvrdma firewall rule; the host\u2019s agent applies them at once.'),
    field('cf-addr', 'PVRDMA address (ADDRESS:PORT, empty for none)', h('input', { type: 'text', value: p.pvrdma_address || '', placeholder: '192.0.2.10:4791' })),
    field('cf-vmknic', 'Tagged VMkernel adapter', h('input', { type: 'text', value: p.pvrdma_vmknic || '', placeholder: 'vmk1' })),
    box('cf-fw', 'pvrdma firewall rule enabled', p.firewall_pvrdma),
    box('cf-ns', 'PVRDMA namespaces (native endpoints need them)', p.pvrdma_namespaces),
    box('cf-maint', 'Maintenance mode', p.maintenance),
    h('div', { class: 'row' }, h('button', { type: 'submit', class: 'primary', id: 'configure-save' }, 'Save')), out);
  // What an uplink's NIC does for lossless Ethernet, where its kernel
  // cannot say (vrdmactl host uplink declare): only the fields set are sent.
  const dout = h('div', { id: 'declare-result', role: 'status', 'aria-live': 'polite' });
  const keep = xs => [['', 'leave as it is'], ...xs, ['unknown', 'unknown (remove the declaration)']].map(([k, t]) => h('option', { value: k }, t));
  const declare = p.uplinks.length ? h('form', { id: 'declare', 'aria-labelledby': 'declare-h', onsubmit: async ev => {
    ev.preventDefault();
    const d = {}, v = id => document.getElementById(id).value.trim();
    for (const [k, id] of [['pfc', 'dc-pfc'], ['pause', 'dc-pause'], ['trust', 'dc-trust'], ['mtu', 'dc-mtu']]) if (v(id)) d[k] = v(id);
    if (!Object.keys(d).length) return dout.replaceChildren(h('p', { class: 'msg' }, 'Nothing to declare.'));
    const up = v('dc-uplink');
    const res = await api('/api/hosts/' + encodeURIComponent(id) + '/uplinks/' + encodeURIComponent(up) + '/declare', d);
    if (!res.ok) return dout.replaceChildren(errorBox('Not declared: ' + res.data.error));
    await hostPage(id);
    document.getElementById('declare-result').replaceChildren(h('p', { class: 'msg ok' }, 'Uplink ' + up + ' declares: ' + res.data.uplinks.find(u => u.name === up).declared + '.'));
  } },
    h('h2', { id: 'declare-h' }, 'RDMA uplinks: lossless Ethernet'),
    h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, ['Uplink', 'Kind', 'Address', 'Declared', 'Observed'].map(t => h('th', {}, t)))),
      h('tbody', {}, p.uplinks.map(u => h('tr', {}, [u.name, u.kind, u.address, u.declared, u.observed].map(t => h('td', {}, t))))))),
    h('p', { class: 'muted' }, 'Declare what an uplink\u2019s NIC does where its kernel reports nothing (no DCB on veth, virtio or loopback); the network checks and path selection use it, and what the kernel reports wins.'),
    field('dc-uplink', 'Uplink', h('select', {}, p.uplinks.map(u => h('option', { value: u.name }, u.name)))),
    field('dc-pfc', 'Priorities with PFC on (3, 3,4, none or unknown)', h('input', { type: 'text', placeholder: '3' })),
    field('dc-pause', '802.3x global pause', h('select', {}, keep([['off', 'off'], ['rx,tx', 'rx,tx'], ['rx', 'rx'], ['tx', 'tx']]))),
    field('dc-trust', 'Priority from', h('select', {}, keep([['pcp', 'PCP'], ['dscp', 'DSCP']]))),
    field('dc-mtu', 'NIC MTU', h('input', { type: 'text', inputmode: 'numeric', placeholder: '9000' })),
    h('div', { class: 'row' }, h('button', { type: 'submit', class: 'primary', id: 'declare-save' }, 'Declare')), dout) : null;
  show('Host ' + ho.name,
    h('h1', {}, 'Host ' + ho.name, ' ', h('span', { class: 'badge ' + ho.state }, ho.state)),
    h('table', { class: 'kv' }, h('tbody', {},
      [['ID', ho.id], ['Switch', p.switch || '–'], ['PVRDMA address (tagged vmknic)', (p.pvrdma_address || 'none') + (p.pvrdma_vmknic ? ' on ' + p.pvrdma_vmknic : '')],
        ['pvrdma firewall rule', p.firewall_pvrdma ? 'enabled' : 'disabled'], ['PVRDMA namespaces', p.pvrdma_namespaces ? 'on' : 'off'],
        ['Agent', p.agent_version], ['Lease', secs(ho.lease_age_s)],
        ['RDMA uplinks', ho.uplinks.length ? ho.uplinks.join(', ') : 'none']].map(([k, v]) => h('tr', {}, h('th', { scope: 'row' }, k), h('td', {}, v))))),
    form, declare,
    p.agent ? [h('h2', {}, p.local ? 'This agent' : 'Its agent'),
      p.pvrdma ? h('p', {}, 'Listening on ' + (p.pvrdma.listening || '–') + (p.pvrdma.error ? ' · ' + p.pvrdma.error : '')) : null,
      h('h3', {}, 'TCP uplinks to other hosts'),
      p.tcp_uplinks.length ? h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, ['Peer', 'Address', 'State', 'Bytes out', 'Bytes in'].map(t => h('th', {}, t)))),
        h('tbody', {}, p.tcp_uplinks.map(u => h('tr', {}, [u.peer_host, u.address, u.state, u.bytes_out, u.bytes_in].map(t => h('td', {}, t))))))) : h('p', { class: 'muted' }, 'None yet.')]
      : h('p', { class: 'muted' }, 'Counters are shown for hosts whose agent the console reads (its own, and vrdmactl console --agent).'));
}

// settingsPage is a switch's or a port group's settings form: what the
// inventory says of it now, and Save sends what changed (vrdmactl switch
// set, portgroup set).
async function settingsPage(kind, name) {
  const title = (kind === 'switch' ? 'Switch ' : 'Port group ') + name;
  const r = await api('/api/inventory');
  if (!r.ok) return show(title, h('h1', {}, title), errorBox(r.data.error));
  const sw = kind === 'switch' ? r.data.switches.find(x => x.name === name) : null;
  const pg = kind === 'switch' ? null : r.data.switches.flatMap(x => x.portgroups).find(x => x.key === name);
  const cur = sw || pg;
  if (!cur) return show(title, h('h1', {}, title), errorBox(title + ': not in the control plane.'));
  const opts = (xs, v) => xs.map(([k, t]) => h('option', { value: k, selected: String(v) === k }, t));
  const fields = sw ? [
    ['mtu', 'MTU', h('input', { type: 'number', min: 1280, max: 9000, value: sw.mtu }), Number],
    ['uplink_policy', 'Uplink policy', h('select', {}, opts([['single', 'single'], ['failover', 'failover']], sw.uplink_policy)), String],
    ['network_policy', 'Network policy (how path selection obeys the network checks)', h('select', {}, opts([['strict', 'strict'], ['warn', 'warn'], ['off', 'off']], sw.network_policy)), String],
  ] : [
    ['name', 'Name', h('input', { type: 'text', value: pg.name }), String],
    ['vlan', 'VLAN (0: untagged)', h('input', { type: 'number', min: 0, max: 4094, value: pg.vlan }), Number],
    ['pfc_priority', 'PFC priority', h('input', { type: 'number', min: 0, max: 7, value: pg.pfc_priority }), Number],
    ['dscp', 'DSCP', h('input', { type: 'number', min: 0, max: 63, value: pg.dscp }), Number],
    ['roce_version', 'RoCE version', h('select', {}, opts([['v2', 'RoCE v2'], ['v1', 'RoCE v1']], pg.roce_version)), String],
    ['roce_mtu', 'RoCE MTU', h('select', {}, opts([['0', 'the largest the switch carries'], ['256', '256'], ['512', '512'], ['1024', '1024'], ['2048', '2048'], ['4096', '4096']], pg.roce_mtu)), Number],
    ['subnet', 'Subnet (empty for none)', h('input', { type: 'text', value: pg.subnet || '', placeholder: '10.1.0.0/24' }), String],
  ];
  const out = h('div', { id: 'set-result', role: 'status', 'aria-live': 'polite' });
  const path = kind === 'switch' ? '/api/switches/' : '/api/portgroups/';
  const form = h('form', { id: 'settings', onsubmit: async ev => {
    ev.preventDefault();
    const c = {};
    for (const [k, , input, conv] of fields) {
      const v = conv(input.value.trim());
      if (v !== conv(cur[k] === undefined ? '' : cur[k])) c[k] = v;
    }
    if (!Object.keys(c).length) return out.replaceChildren(h('p', { class: 'msg' }, 'Nothing changed.'));
    const res = await api(path + encodeURIComponent(name) + '/set', c);
    if (!res.ok) return out.replaceChildren(errorBox('Not saved: ' + res.data.error));
    await settingsPage(kind, name);
    document.getElementById('set-result').replaceChildren(h('p', { class: 'msg ok' }, title + ' saved: ' + Object.keys(c).join(', ') + '.'));
  } },
    fields.map(([k, label, input]) => field('set-' + k, label, input)),
    h('div', { class: 'row' }, h('button', { type: 'submit', class: 'primary', id: 'set-save' }, 'Save')), out);
  show(title, h('h1', {}, title),
    h('p', { class: 'muted' }, sw ? 'UUID ' + sw.uuid + ' · ' + sw.portgroups.length + ' port groups' : 'On switch ' + r.data.switches.find(x => x.portgroups.includes(pg)).name + '. Agents decide new connections with the new settings at once; established QPs keep their path.'),
    form);
}

// networkPage shows the RoCE network checks and their fixes.
async function networkPage() {
  const r = await api('/api/network');
  if (!r.ok) return show('Network', h('h1', {}, 'Network checks'), errorBox(r.data.error));
  const p = r.data, c = p.counts || {};
  show('Network', h('h1', {}, 'Network checks'),
    h('p', { class: 'msg ' + (p.ok ? 'ok' : 'error') }, (p.ok ? 'Every check passes' : 'Not every check passes') + ': ' + (c.pass || 0) + ' pass, ' + (c.fail || 0) + ' fail, ' + (c.unknown || 0) + ' unknown.'),
    p.switches.map(sw => h('section', { 'aria-label': 'Switch ' + sw.switch },
      h('h2', {}, 'Switch ' + sw.switch, ' ', h('span', { class: 'attrs' }, 'network policy ' + sw.networkPolicy)),
      sw.results.length ? h('ul', { class: 'findings' }, sw.results.map(x => h('li', { class: x.status === 'pass' ? '' : x.status === 'fail' ? 'error' : 'warning' },
        h('span', { class: 'sev' }, x.status), h('code', {}, x.check), ' ' + x.subject + (x.portGroup ? ' (' + x.portGroup + ')' : '') + ': ' + x.detail,
        x.fix ? h('div', {}, h('strong', {}, 'Fix: '), x.fix) : null))) : null,
      (sw.notes || []).map(n => h('p', { class: 'muted' }, n)))));
}

// live polls the agent every second and charts each VM's bytes and
// operations per second (sent and received, all adapters).
async function live() {
  const hist = {}; // VM → {bytes: [per s], ops: [per s]}
  let last = null;
  const body = h('div', {}), mapBox = h('div', { id: 'map' });
  let lastEdges = {};
  show('Live', h('h1', {}, 'Live: QPs, paths and throughput'), h('p', { class: 'muted' }, 'Updated every second from the agents\u2019 counters.'),
    h('section', { 'aria-labelledby': 'map-h' }, h('h2', { id: 'map-h' }, 'Map of hosts and paths'), mapBox), body, explainForm());
  const sum = (v, f) => v.adapters.reduce((s, a) => s + f(a.counters), 0);
  const bytes = c => c.send_bytes + c.recv_bytes;
  const ops = c => Object.values(c.ops || {}).reduce((x, y) => x + y, 0) + c.recvs;
  const errs = c => c.transport_retries + c.rnr_naks_received + c.rnr_naks_sent + c.requests_dropped + c.duplicate_requests + c.out_of_seq_requests;
  let busy = false; // a slow answer is not asked for again before it comes
  const tick = async () => {
    if (busy) return;
    busy = true;
    const r = await api('/api/live');
    busy = false;
    if (!r.ok) return body.replaceChildren(errorBox(r.data.error));
    const now = r.data, t = Date.parse(now.time) / 1000;
    const edt = last ? t - Date.parse(last.time) / 1000 : 0, edges = {};
    for (const e of now.edges) {
      const k = e.a + ' ' + e.b + ' ' + e.path;
      edges[k] = e.bytes;
      e.rate = k in lastEdges && edt > 0 ? Math.max(0, (e.bytes - lastEdges[k]) / edt) : 0;
    }
    lastEdges = edges;
    keepFocus(mapBox, () => mapBox.replaceChildren(hostMap(now), h('ul', {}, now.errors.map(x => h('li', { class: 'msg error' }, x)))));
    const kids = [];
    for (const v of now.vms) {
      const prev = last && last.vms.find(x => x.name === v.name);
      const dt = last ? t - Date.parse(last.time) / 1000 : 0;
      const rate = f => prev && dt > 0 ? Math.max(0, (sum(v, f) - sum(prev, f)) / dt) : 0;
      const hv = hist[v.name] = hist[v.name] || { bytes: [], ops: [] };
      const br = rate(bytes), or = rate(ops);
      hv.bytes.push(br); hv.ops.push(or);
      if (hv.bytes.length > 60) { hv.bytes.shift(); hv.ops.shift(); }
      const cb = h('canvas', { width: 640, height: 140, role: 'img', 'aria-label': 'Throughput of VM ' + v.name + ' over the last minute, MB/s' });
      const co = h('canvas', { width: 640, height: 140, role: 'img', 'aria-label': 'Operations of VM ' + v.name + ' per second over the last minute' });
      draw(cb, hv.bytes, 1e6, 'MB/s');
      draw(co, hv.ops, 1, 'ops/s');
      kids.push(h('section', { 'aria-label': 'VM ' + v.name },
        h('h2', {}, h('a', { href: '#/vm/' + encodeURIComponent(v.name) }, 'VM ' + v.name), ' ', h('span', { class: 'attrs' }, 'on host ' + v.host)),
        h('p', { class: 'rate' }, 'Throughput ' + (br / 1e6).toFixed(2) + ' MB/s'), cb,
        h('p', { class: 'ops-rate' }, 'Operations ' + or.toFixed(0) + ' per second'), co,
        h('p', { class: 'errs' }, 'Retries, RNR NAKs, drops and sequence errors: ' + sum(v, errs)),
        h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, ['QPN', 'Adapter', 'State', 'Peer', 'Path', 'Reason', 'Rejected', 'Bytes sent', 'Errors'].map(x => h('th', {}, x)))),
          h('tbody', {}, v.qps.map(q => h('tr', {}, [q.qpn, q.adapter, q.state, q.peer ? q.peer + ' QP ' + q.peer_qpn : '\u2013', q.path.path, q.path.reason,
            (q.path.rejected || []).map(x => x.path + ': ' + x.why).join('; ') || '\u2013', q.counters.send_bytes, errs(q.counters)].map(x => h('td', {}, x))))))),
        v.hidden ? h('p', { class: 'muted' }, 'Another user\u2019s VM: its QPs and counters are hidden.') : null));
    }
    keepFocus(body, () => body.replaceChildren(...(kids.length ? kids : [h('p', { class: 'muted' }, 'No VM is attached on the hosts whose agents the console reads.')])));
    last = now;
  };
  await tick();
  timer = setInterval(tick, 1000);
}

// keepFocus runs render, which draws box again, and gives the focus back
// to the link that had it (the same href), so that a keyboard user's
// place survives the live view's updates.
function keepFocus(box, render) {
  const a = document.activeElement;
  const href = a && box.contains(a) ? a.getAttribute('href') : null;
  render();
  if (href === null) return;
  const e = [...box.querySelectorAll('a')].find(x => x.getAttribute('href') === href);
  if (e) e.focus();
}

// svg builds an SVG element.
function svg(tag, attrs, ...kids) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

// hostMap draws the hosts on a circle and the paths their QPs take
// between them, each labelled with its kind and its traffic, and lists
// the same as text.
function hostMap(l) {
  const W = 640, H = 300, cx = W / 2, cy = H / 2, n = l.hosts.length;
  const at = {};
  l.hosts.forEach((ho, i) => {
    const a = 2 * Math.PI * i / Math.max(n, 1) - Math.PI / 2;
    at[ho.id] = n === 1 ? [cx, cy] : [cx + (W / 2 - 90) * Math.cos(a), cy + (H / 2 - 50) * Math.sin(a)];
  });
  const name = id => (l.hosts.find(x => x.id === id) || { name: id }).name;
  const label = e => e.path + ' · ' + e.qps + (e.qps === 1 ? ' QP' : ' QPs') + ' · ' + (e.rate / 1e6).toFixed(2) + ' MB/s';
  const pic = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-labelledby': 'map-title', class: 'map' },
    svg('title', { id: 'map-title' }, 'Hosts and the paths between them'));
  l.edges.forEach((e, i) => {
    const [x1, y1] = at[e.a] || [cx, cy], [x2, y2] = at[e.b] || [cx, cy];
    const off = (i % 2 ? 1 : -1) * 12 * Math.ceil(i / 2); // edges of one pair side by side
    pic.append(svg('line', { x1, y1: y1 + off, x2, y2: y2 + off, class: 'edge ' + e.path }),
      svg('text', { x: (x1 + x2) / 2, y: (y1 + y2) / 2 + off - 6, 'text-anchor': 'middle', class: 'edge-label' }, label(e)));
  });
  for (const ho of l.hosts) {
    const [x, y] = at[ho.id];
    pic.append(svg('a', { href: '#/host/' + encodeURIComponent(ho.id) },
      svg('circle', { cx: x, cy: y, r: 26, class: 'node' + (ho.agent ? ' read' : '') }),
      svg('text', { x, y: y + 4, 'text-anchor': 'middle' }, ho.name),
      svg('text', { x, y: y + 42, 'text-anchor': 'middle', class: 'edge-label' }, ho.same_host_qps ? 'memcpy · ' + ho.same_host_qps + ' QPs' : ho.agent ? '' : 'agent not read')));
  }
  return h('div', {}, pic, h('ul', { id: 'edges', 'aria-label': 'Paths between hosts' },
    l.edges.length ? l.edges.map(e => h('li', {}, name(e.a) + ' \u2194 ' + name(e.b) + ': ' + label(e))) : h('li', { class: 'muted' }, 'No QP between two hosts.')));
}

// explainForm asks the control plane which path two adapters get, as
// vrdmactl path explain.
function explainForm() {
  const out = h('div', { id: 'path-result', role: 'status', 'aria-live': 'polite' });
  const a = h('input', { type: 'text', id: 'path-a', placeholder: 'vm1/vrdma0' });
  const b = h('input', { type: 'text', id: 'path-b', placeholder: 'vm2/vrdma0' });
  return h('form', { id: 'explain', onsubmit: async ev => {
    ev.preventDefault();
    const r = await api('/api/path?a=' + encodeURIComponent(a.value.trim()) + '&b=' + encodeURIComponent(b.value.trim()));
    if (!r.ok) return out.replaceChildren(errorBox(r.data.error));
    const d = r.data;
    out.replaceChildren(
      d.ok ? h('p', { class: 'msg ok' }, d.a + ' \u2194 ' + d.b + ': ' + d.path + ' \u2014 ' + d.reason) : errorBox(d.a + ' \u2194 ' + d.b + ': cannot connect: ' + d.error),
      h('ul', {}, d.rejected.map(x => h('li', {}, 'rejected ' + x.path + ': ' + x.why)), (d.warnings || []).map(w => h('li', {}, 'warning: ' + w))));
  } },
    h('h2', {}, 'Explain a path'),
    h('div', { class: 'row' }, h('label', { for: 'path-a' }, 'From'), a, h('label', { for: 'path-b' }, 'to'), b,
      h('button', { type: 'submit', id: 'explain-go' }, 'Explain')),
    out);
}

// draw charts xs (per second, the last 60) on cv, in units of scale.
function draw(cv, xs, scale, unit) {
  const c = cv.getContext('2d'), w = cv.width, ht = cv.height;
  const top = Math.max(scale, ...xs);
  c.clearRect(0, 0, w, ht);
  c.strokeStyle = '#0a58ca';
  c.lineWidth = 2;
  c.beginPath();
  xs.forEach((x, i) => {
    const px = (i / 59) * (w - 4) + 2, py = ht - 4 - (x / top) * (ht - 20);
    if (i) c.lineTo(px, py); else c.moveTo(px, py);
  });
  c.stroke();
  c.fillStyle = '#57606a';
  c.font = '12px sans-serif';
  c.fillText('max ' + (top / scale).toFixed(scale > 1 ? 2 : 0) + ' ' + unit, 6, 14);
}

async function route() {
  if (timer) { clearInterval(timer); timer = null; }
  const [, page, arg] = (location.hash || '#/').match(/^#\/([^/]*)\/?(.*)$/) || [];
  const a = decodeURIComponent(arg || '');
  if (page === 'vm' && a) await vmPage(a);
  else if (page === 'host' && a) await hostPage(a);
  else if ((page === 'switch' || page === 'portgroup') && a) await settingsPage(page, a);
  else if (page === 'live') await live();
  else if (page === 'network') await networkPage();
  else await inventory();
  main.focus();
  document.body.dataset.ready = location.hash || '#/';
}

window.addEventListener('hashchange', route);
route();
