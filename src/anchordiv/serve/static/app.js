// anchordiv serve: the page. Every string from the server is put in the DOM with textContent.
'use strict';

const $ = (id) => document.getElementById(id);
// written: the context of written anchors on view ({name, anchors, model, tau, before: the columns it replaced});
// picks: the initial columns.
const state = { info: null, query: null, seq: 0, controllers: [], written: null, writeSeq: 0, picks: [],
                restoring: false };
const TYPED = 'typed:';
const POLL_MS = 300;
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') node.className = v; else node.setAttribute(k, v);
  }
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function option(value, text) {
  const o = el('option', { value }, text);
  return o;
}

function fmt(x) { return String(Number(Number(x).toFixed(2))); }

function modelInfo(name) { return state.info.models.find((m) => m.name === name); }

// The panel's anchors spec: set A, or A and B mixed by the slider.
function panelContext() {
  const a = $('set-a').value, b = $('set-b').value, p = Number($('mix').value);
  if (!a) return null;
  if (!b || b === a || p >= 1) return a;
  if (p <= 0) return b;
  return `${a}:${fmt(p)},${b}:${fmt(1 - p)}`;
}

function updateMixLabel() {
  const a = $('set-a').value, b = $('set-b').value, p = Number($('mix').value);
  const mixing = b && b !== a;
  $('mix').disabled = !mixing;
  const text = mixing ? `${a} ${fmt(p)} · ${b} ${fmt(1 - p)}` : `${a} only`;
  $('mix-out').textContent = text;
  $('mix').setAttribute('aria-valuetext', text);
}

// A context name, as /indices-list gives it: MODEL, MODEL:SETS, index:NAME or typed:DIGEST (written anchors).
function column(name) {
  const model = name.split(':')[0];
  return { name, model: model === 'index' || name.startsWith(TYPED) ? null : model };
}

// The panel's context name: the geometry, with the panel's anchors when it takes anchors.
function panelName() {
  const model = $('model').value;
  const sets = panelContext();
  return modelInfo(model).needs_anchors && sets ? `${model}:${sets}` : model;
}

// The contexts shown: one column, or the side-by-side columns.
function columns() {
  const panel = column(panelName());
  if (!$('side').checked) return [panel];
  const out = [];
  for (const sel of document.querySelectorAll('.col-select')) {
    const v = sel.value;
    if (!v) continue;
    out.push(v === 'panel' ? panel : column(v));
  }
  return out.length ? out : [panel];
}

function request(col) {
  const body = { context: col.name, k: Number($('k').value) || 12 };
  const tau = $('tau').value.trim();
  const info = col.model && modelInfo(col.model);
  if (info && info.takes_temperature && tau) body.tau = Number(tau);
  const f = $('filter').value;
  if (f) body.filter = JSON.parse(f);
  return body;
}

async function post(body, signal) {
  let init;
  if (state.query.image) {
    const form = new FormData();
    form.append('image', state.query.image);
    for (const [k, v] of Object.entries(body)) form.append(k, typeof v === 'object' ? JSON.stringify(v) : String(v));
    init = { method: 'POST', body: form, signal };
  } else {
    init = { method: 'POST', headers: { 'Content-Type': 'application/json' },
             body: JSON.stringify({ ...body, ...state.query.fields }), signal };
  }
  const resp = await fetch('/api/search', init);
  const data = await resp.json();
  if (!resp.ok) throw new Error(data.error || `HTTP ${resp.status}`);
  return data;
}

function setStatus(text, error) {
  $('status').textContent = text;
  $('status').classList.toggle('error', Boolean(error));
}

function renderColumn(section, data) {
  section.replaceChildren();
  const ctx = data.context;
  section.append(el('h2', {}, ctx.name));
  section.append(el('p', { class: 'similarity' }, `similarity = ${ctx.similarity}`));
  if (ctx.written && ctx.written.length) {
    section.append(el('p', { class: 'written' }, `Written anchors (${ctx.model}, τ = ${ctx.tau}): ` +
                                                 ctx.written.map((t) => `“${t}”`).join(' · ')));
  }
  if (data.why && data.why.length) {
    const parts = data.why.map((w) => `“${w.anchor}” ${(100 * w.mass).toFixed(0)}%` + (w.set ? ` (${w.set})` : ''));
    section.append(el('p', { class: 'why' }, `Why: the query puts most anchor mass on ${parts.join(', ')}`));
  }
  const grid = el('ol', { class: 'grid', 'aria-label': `Neighbours under ${section.dataset.title}` });
  const qlabels = (data.query && data.query.labels) || {};
  for (const hit of data.results) {
    const li = el('li');
    const label = hit.text || `item ${hit.id}`;
    const card = el('button', { type: 'button', class: 'card', 'data-id': String(hit.id),
                                'data-row': String(hit.row), 'aria-label': `Use as query: ${label}` });
    if (hit.thumbnail) card.append(el('img', { src: hit.thumbnail, alt: label, loading: 'lazy' }));
    card.append(el('p', { class: 'text' }, label));
    card.append(el('p', { class: 'dist' }, `#${hit.rank} · id ${hit.id} · d = ${Number(hit.distance).toPrecision(4)}` +
                                           ` · similarity ${Number(hit.similarity).toPrecision(4)}`));
    const labels = Object.entries(hit.labels || {});
    if (labels.length) {
      const chips = el('ul', { class: 'chips', 'aria-label': 'labels' });
      for (const [k, v] of labels) {
        const match = qlabels[k] !== undefined && qlabels[k] === v;
        chips.append(el('li', { class: match ? 'chip match' : 'chip' }, `${k}: ${v}`));
      }
      card.append(chips);
    }
    card.addEventListener('click', () => setQuery({ fields: { id: hit.id }, label: `item ${hit.id}: ${label}` }));
    li.append(card);
    grid.append(li);
  }
  section.append(grid);
  section.dataset.ids = data.results.map((h) => h.id).join(',');
}

async function runAll() {
  syncURL();
  if (!state.info || !state.query) return;
  for (const c of state.controllers) c.abort();
  state.controllers = [];
  const seq = ++state.seq;
  const cols = columns();
  const results = $('results');
  results.replaceChildren();
  results.dataset.seq = String(seq);
  results.dataset.state = 'loading';
  setStatus('Searching…');
  const sections = cols.map((col, i) => {
    const s = el('section', { class: 'column', 'data-column': String(i), 'data-context': col.name,
                              'data-state': 'loading' });
    s.dataset.title = col.name;
    s.append(el('h2', {}, col.name));
    results.append(s);
    return s;
  });
  const jobs = cols.map(async (col, i) => {
    const ctl = new AbortController();
    state.controllers.push(ctl);
    const data = await post(request(col), ctl.signal);
    if (seq !== state.seq) return null;
    renderColumn(sections[i], data);
    sections[i].dataset.state = 'ready';
    return data;
  });
  try {
    const all = await Promise.all(jobs);
    if (seq !== state.seq) return;
    const ms = Math.max(...all.map((d) => d.took_ms));
    setStatus(`${all[0].results.length} neighbours per context · ${ms.toFixed(1)} ms on the server`);
    results.dataset.state = 'ready';
  } catch (err) {
    if (err.name === 'AbortError' || seq !== state.seq) return;
    for (const s of sections) if (s.dataset.state === 'loading') s.dataset.state = 'error';
    results.dataset.state = 'error';
    setStatus(err.message, true);
  }
}

function showQuery(q) {
  state.query = q;
  $('query-text').textContent = `Query: ${q.label}`;
  $('query-text').dataset.query = JSON.stringify(q.fields);
  $('clear-query').hidden = false;
  writtenReady();
}

function setQuery(q) {
  showQuery(q);
  runAll();
}

function fillSelect(sel, items, withNone) {
  sel.replaceChildren();
  if (withNone) sel.append(option('', withNone));
  for (const [value, text] of items) sel.append(option(value, text));
}

function writtenLabel(name, anchors) {
  const text = anchors.join(' · ');
  return `${name} (written: ${text.length > 40 ? `${text.slice(0, 39)}…` : text})`;
}

// A context offered in the column selects (added once).
function offerColumn(name, text) {
  document.querySelectorAll('.col-select').forEach((sel) => {
    if (![...sel.options].some((o) => o.value === name)) sel.append(option(name, text || name));
  });
}

// Select value if sel offers it; whether it did.
function pick(sel, value) {
  if (value === null || ![...sel.options].some((o) => o.value === value)) return false;
  sel.value = value;
  return true;
}

function setSide(on) {
  $('side').checked = on;
  $('columns-config').hidden = !on;
}

function init(info) {
  state.info = info;
  document.title = info.title;
  $('title').textContent = info.title;
  const c = info.collection;
  $('collection-info').textContent =
    `${c.n} ${c.kind || 'item'}s · dimension ${c.dim}` + (c.encoder ? ` · encoder ${c.encoder}` : '') +
    (c.tau ? ` · τ = ${c.tau}` : '') + ` · default context ${info.default.name}`;
  fillSelect($('model'), info.models.filter((m) => m.available).map((m) => [m.name, m.name]));
  $('model').value = info.default.model;
  if (info.default.tau) $('tau').value = String(info.default.tau);
  $('k').value = String(info.default.k);
  $('k').max = String(info.limits.max_k);
  $('q').maxLength = info.limits.max_text;
  const sets = info.sets.map((s) => [s.name, `${s.name} (${s.size})`]);
  fillSelect($('set-a'), sets);
  fillSelect($('set-b'), sets, 'none');
  // The panel starts at the default context: its one set at p = 1 (beside the next set), or its two sets.
  const parts = (info.default.anchors || '').split(',').filter(Boolean).map((part) => {
    const at = part.lastIndexOf(':');
    return at < 0 ? [part, 1] : [part.slice(0, at), Number(part.slice(at + 1))];
  });
  if (parts.length) {
    $('set-a').value = parts[0][0];
    const other = info.sets.find((s) => s.name !== parts[0][0]);
    $('set-b').value = parts.length > 1 ? parts[1][0] : (other ? other.name : '');
    $('mix').value = String(parts.length > 1 ? parts[0][1] : 1);
  }
  $('anchors-panel').hidden = !info.sets.length;
  const list = $('set-list');
  for (const s of info.sets) list.append(el('li', {}, `${s.name}: ${s.phrases.join(' · ')}`));
  const filters = [];
  for (const col of c.label_columns) {
    for (const v of c.labels[col]) filters.push([JSON.stringify({ [col]: v }), `${col} = ${v}`]);
  }
  fillSelect($('filter'), filters, 'none');
  const written = new Map((info.written || []).map((w) => [w.context, w.anchors]));
  const colOptions = [['panel', 'the panel (geometry and mixture above)'],
                      ...info.names.map((n) => [n, written.has(n) ? writtenLabel(n, written.get(n)) : n])];
  const anchorModel = info.default.anchors ? info.default.model : 'softmax';
  document.querySelectorAll('.col-select').forEach((sel, i) => {
    fillSelect(sel, colOptions, i === 2 ? 'none' : undefined);
    const want = info.sets[i] ? `${anchorModel}:${info.sets[i].name}` : (i === 0 ? 'panel' : (i === 1 ? 'cosine' : ''));
    sel.value = info.names.includes(want) || want === 'panel' || want === '' ? want : 'panel';
  });
  state.picks = [...document.querySelectorAll('.col-select')].map((sel) => sel.value);
  $('write-form').hidden = !c.text_queries;  // written anchors are embedded by the service's encoder
  $('image-upload').hidden = !c.image_queries;
  $('q').disabled = !c.text_queries;
  if (!c.text_queries) $('q').placeholder = 'No encoder: click an item to query by it';
  updateMixLabel();
}

function wire() {
  $('search-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = $('q').value.trim();
    if (text) setQuery({ fields: { text }, label: `“${text}”` });
  });
  $('image').addEventListener('change', () => {
    const file = $('image').files[0];
    if (file) setQuery({ image: file, fields: {}, label: `image ${file.name}` });
  });
  $('clear-query').addEventListener('click', () => {
    state.query = null;
    state.seq++;
    $('results').replaceChildren();
    $('query-text').textContent = 'No query.';
    $('clear-query').hidden = true;
    setStatus('');
    writtenReady();
    syncURL();
    $('q').focus();
  });
  $('write-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const lines = anchorLines($('anchors-text').value);
    if (!lines.length) {
      writeStatus('error', 'Write at least one anchor, one per line.');
      return;
    }
    const { model, tau } = writeGeometry();
    makeContext(lines, model, tau).then((data) => { if (data) showWritten(data, lines, model, tau); });
  });
  $('anchors-text').addEventListener('input', () => $('anchors-text').removeAttribute('aria-invalid'));
  $('clear-written').addEventListener('click', clearWritten);
  for (const id of ['model', 'tau', 'k', 'filter', 'set-a', 'set-b']) {
    $(id).addEventListener('change', () => { updateMixLabel(); runAll(); });
  }
  $('mix').addEventListener('input', () => { updateMixLabel(); runAll(); });
  $('side').addEventListener('change', () => { setSide($('side').checked); runAll(); });
  document.querySelectorAll('.col-select').forEach((sel) => sel.addEventListener('change', runAll));
}

// ------------------------------------------------------------ written anchors
function anchorLines(text) {
  return String(text).split(/\r?\n/).map((line) => line.trim()).filter(Boolean);
}

// The geometry of written anchors: the panel's when it takes anchors (else softmax), with the page's τ.
function writeGeometry() {
  const panel = modelInfo($('model').value);
  const model = panel && panel.needs_anchors ? panel.name : 'softmax';
  const tau = $('tau').value.trim();
  const info = modelInfo(model);
  return { model, tau: info && info.takes_temperature && tau && Number.isFinite(Number(tau)) ? Number(tau) : null };
}

function writeStatus(kind, text, progress) {
  const box = $('write-status');
  box.dataset.state = kind;
  box.classList.toggle('error', kind === 'error');
  const bar = $('write-progress');
  bar.hidden = progress === undefined || progress === null;
  if (!bar.hidden) {
    bar.value = Math.min(1, Math.max(0, Number(progress) || 0));
    bar.setAttribute('aria-valuetext', `${(100 * bar.value).toFixed(0)}%`);
  }
  $('write-message').textContent = text;
}

async function getJSON(url, init) {
  const resp = await fetch(url, init);
  let data = null;
  try { data = await resp.json(); } catch (err) { data = null; }
  return { ok: resp.ok, status: resp.status, data: data || {} };
}

// POST the anchors, then poll the build while it runs; the ready status, or null (the error is shown).
async function makeContext(lines, model, tau) {
  const seq = ++state.writeSeq;
  const body = { anchors: lines, model };
  if (tau !== null) body.tau = tau;
  $('anchors-text').removeAttribute('aria-invalid');
  writeStatus('building', `Embedding ${lines.length} anchor${lines.length === 1 ? '' : 's'}…`, 0);
  try {
    let r = await getJSON('/api/contexts', { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                             body: JSON.stringify(body) });
    while (r.ok && r.data.status === 'building') {
      if (seq !== state.writeSeq) return null;
      const pct = (100 * (Number(r.data.progress) || 0)).toFixed(0);
      writeStatus('building', `Building ${r.data.context}: ${pct}% of the collection`, r.data.progress);
      await sleep(POLL_MS);
      if (seq !== state.writeSeq) return null;
      r = await getJSON(`/api/contexts/${encodeURIComponent(r.data.context)}`);
    }
    if (seq !== state.writeSeq) return null;
    if (!r.ok || r.data.status !== 'ready') {
      const msg = r.data.error || (r.ok ? `${r.data.context} is ${r.data.status}` : `HTTP ${r.status}`);
      if (!r.ok && String(r.data.field || '').startsWith('anchors')) $('anchors-text').setAttribute('aria-invalid', 'true');
      writeStatus('error', msg);
      return null;
    }
    return r.data;
  } catch (err) {
    if (seq === state.writeSeq) writeStatus('error', `Cannot reach the service: ${err.message}`);
    return null;
  }
}

// Show a ready written context beside cosine and the file's first set (in the same geometry), unless
// keepColumns: the columns were chosen already (a shared URL).
function showWritten(data, lines, model, tau, keepColumns) {
  const name = data.context;
  const selects = [...document.querySelectorAll('.col-select')];
  const before = state.written ? state.written.before
    : { side: keepColumns ? false : $('side').checked, cols: keepColumns ? state.picks : selects.map((sel) => sel.value) };
  state.written = { name, anchors: lines, model, tau, before };
  offerColumn(name, writtenLabel(name, lines));
  if (!keepColumns) {
    const first = state.info.sets[0];
    const picks = [name, 'cosine', first ? `${model}:${first.name}` : ''];
    if (picks[2]) offerColumn(picks[2]);
    document.querySelectorAll('.col-select').forEach((sel, i) => { sel.value = picks[i]; });
    setSide(true);
  }
  $('clear-written').hidden = false;
  writtenReady(true);
  if (!state.restoring) runAll();
}

// The written context's ready line (kept while another build or an error is shown, unless force).
function writtenReady(force) {
  if (!state.written || (!force && $('write-status').dataset.state !== 'ready')) return;
  const name = state.written.name;
  writeStatus('ready', state.query ? `Ready: ${name}, shown beside the other columns.`
                                   : `Ready: ${name}. Give a query (text, or click an item) to see its neighbours.`, 1);
}

function clearWritten() {
  const w = state.written;
  if (!w) return;
  state.written = null;
  state.writeSeq++;
  document.querySelectorAll('.col-select').forEach((sel, i) => { sel.value = w.before.cols[i]; });
  setSide(w.before.side);
  $('clear-written').hidden = true;
  writeStatus('', '');
  runAll();
}

// ------------------------------------------------------------ the URL holds the page's state
function syncURL() {
  if (state.restoring || !state.info) return;
  const p = new URLSearchParams();
  const q = state.query ? state.query.fields : {};
  if (q.text !== undefined) p.set('q', q.text);
  else if (q.id !== undefined) p.set('id', String(q.id));
  p.set('model', $('model').value);
  if ($('tau').value.trim()) p.set('tau', $('tau').value.trim());
  p.set('k', $('k').value);
  if ($('filter').value) p.set('filter', $('filter').value);
  if ($('set-a').value) p.set('a', $('set-a').value);
  if ($('set-b').value) p.set('b', $('set-b').value);
  if (state.info.sets.length) p.set('mix', $('mix').value);
  if ($('side').checked) {
    p.set('side', '1');
    const w = state.written && state.written.name;
    document.querySelectorAll('.col-select').forEach((sel) => p.append('cols', sel.value === w ? 'written' : sel.value));
  }
  if (state.written) {
    p.set('anchors', state.written.anchors.join('\n'));
    p.set('amodel', state.written.model);
    if (state.written.tau !== null) p.set('atau', String(state.written.tau));
  }
  history.replaceState(null, '', `${location.pathname}?${p.toString()}`);
}

// A number from the URL within [lo, hi], else null.
function numberParam(p, name, lo, hi) {
  const raw = p.get(name);
  if (raw === null || !raw.trim()) return null;
  const x = Number(raw);
  return Number.isFinite(x) && x >= lo && x <= hi ? x : null;
}

// Read the controls, the written anchors and the query back from the URL; what is invalid is ignored.
async function restore() {
  const p = new URLSearchParams(location.search);
  const info = state.info;
  state.restoring = true;
  try {
    pick($('model'), p.get('model'));
    const tau = numberParam(p, 'tau', Number($('tau').min), Number($('tau').max));
    if (tau !== null) $('tau').value = String(tau);
    const k = numberParam(p, 'k', 1, info.limits.max_k);
    if (k !== null && Number.isInteger(k)) $('k').value = String(k);
    pick($('filter'), p.get('filter'));
    pick($('set-a'), p.get('a'));
    pick($('set-b'), p.get('b'));
    const mix = numberParam(p, 'mix', 0, 1);
    if (mix !== null) $('mix').value = String(mix);
    updateMixLabel();
    if (p.get('side') === '1') setSide(true);
    const text = p.get('q');
    if (text && text.trim() && info.collection.text_queries) {
      const t = text.trim().slice(0, info.limits.max_text);
      $('q').value = t;
      showQuery({ fields: { text: t }, label: `“${t}”` });
    } else if (p.get('id') !== null && p.get('id') !== '') {
      const r = await getJSON(`/api/items/${encodeURIComponent(p.get('id'))}`);
      if (r.ok && r.data.id !== undefined) {
        const label = r.data.text || `item ${r.data.id}`;
        showQuery({ fields: { id: r.data.id }, label: `item ${r.data.id}: ${label}` });
      }
    }
    const lines = anchorLines(p.get('anchors') || '');
    if (lines.length && !$('write-form').hidden) {
      $('anchors-text').value = lines.join('\n');
      const amodel = modelInfo(p.get('amodel') || '');
      const model = amodel && amodel.needs_anchors && amodel.available ? amodel.name : writeGeometry().model;
      const atau = numberParam(p, 'atau', Number($('tau').min), Number($('tau').max));
      const geometry = modelInfo(model).takes_temperature ? (atau !== null ? atau : writeGeometry().tau) : null;
      const data = await makeContext(lines, model, geometry);
      if (data) showWritten(data, lines, model, geometry, p.getAll('cols').length > 0);
    }
    const w = state.written && state.written.name;
    p.getAll('cols').slice(0, 3).forEach((v, i) => { pick($(`col-${i}`), v === 'written' ? w : v); });
  } catch (err) {
    // a URL that cannot be read back leaves the page as it is
  } finally {
    state.restoring = false;
  }
  runAll();
}

async function main() {
  wire();
  try {
    const resp = await fetch('/api/contexts');
    init(await resp.json());
  } catch (err) {
    setStatus(`Cannot load the service description: ${err.message}`, true);
    return;
  }
  await restore();
  document.body.dataset.ready = 'true';
}

main();
