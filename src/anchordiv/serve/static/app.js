// anchordiv serve: the page. Every string from the server is put in the DOM with textContent.
'use strict';

const $ = (id) => document.getElementById(id);
const state = { info: null, query: null, seq: 0, controllers: [] };

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

// A context name, as /indices-list gives it: MODEL, MODEL:SETS or index:NAME.
function column(name) {
  const model = name.split(':')[0];
  return { name, model: model === 'index' ? null : model };
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
  if (col.model && modelInfo(col.model).takes_temperature && tau) body.tau = Number(tau);
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

function setQuery(q) {
  state.query = q;
  $('query-text').textContent = `Query: ${q.label}`;
  $('query-text').dataset.query = JSON.stringify(q.fields);
  $('clear-query').hidden = false;
  runAll();
}

function fillSelect(sel, items, withNone) {
  sel.replaceChildren();
  if (withNone) sel.append(option('', withNone));
  for (const [value, text] of items) sel.append(option(value, text));
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
  const colOptions = [['panel', 'the panel (geometry and mixture above)'], ...info.names.map((n) => [n, n])];
  const anchorModel = info.default.anchors ? info.default.model : 'softmax';
  document.querySelectorAll('.col-select').forEach((sel, i) => {
    fillSelect(sel, colOptions, i === 2 ? 'none' : undefined);
    const pick = info.sets[i] ? `${anchorModel}:${info.sets[i].name}` : (i === 0 ? 'panel' : (i === 1 ? 'cosine' : ''));
    sel.value = info.names.includes(pick) || pick === 'panel' || pick === '' ? pick : 'panel';
  });
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
    $('q').focus();
  });
  for (const id of ['model', 'tau', 'k', 'filter', 'set-a', 'set-b']) {
    $(id).addEventListener('change', () => { updateMixLabel(); runAll(); });
  }
  $('mix').addEventListener('input', () => { updateMixLabel(); runAll(); });
  $('side').addEventListener('change', () => { $('columns-config').hidden = !$('side').checked; runAll(); });
  document.querySelectorAll('.col-select').forEach((sel) => sel.addEventListener('change', runAll));
}

async function main() {
  wire();
  try {
    const resp = await fetch('/api/contexts');
    init(await resp.json());
    document.body.dataset.ready = 'true';
  } catch (err) {
    setStatus(`Cannot load the service description: ${err.message}`, true);
  }
}

main();
