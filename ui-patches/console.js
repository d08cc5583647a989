/* gpustack-dspark console: reads GET /v2/dspark/console every few seconds (GPUStack's own
 * session cookie), draws the DSpark deployments, and edits their knobs through
 * POST /v2/dspark/console/models/{id}/preview and /apply (admins). Plain JS, no build step,
 * nothing from outside GPUStack's origin. */
(function () {
  'use strict';
  var API = '/v2/dspark/console';
  var REFRESH_MS = 3000;
  var cards = {};          // deployment id -> {root, live, editor}
  var lastOk = null;

  var FIGURES = [
    ['output_tokens_per_s', 'Output tokens/s', fmt(1)],
    ['latency_p50_s', 'P50 latency', secs],
    ['latency_p99_s', 'P99 latency', secs],
    ['acceptance_rate', 'Acceptance rate', pct],
    ['tokens_per_forward', 'Tokens / forward pass', fmt(2)],
    ['format_errors', 'JSON format errors', fmt(0)],
    ['prefix_cache_hit_rate', 'Prefix-cache hit rate', pct],
    ['withheld', 'Withheld replies', fmt(0)]
  ];
  var KNOBS = [
    ['--dspark-speculative-length', 'Speculative length', 'auto or 1-16'],
    ['--dspark-accept-threshold', 'Accept threshold', '0 < x < 1'],
    ['--dspark-grammar-mode', 'Grammar mode', 'json | off'],
    ['--dspark-warmup-requests', 'Warmup requests', '0-10000'],
    ['--dspark-warmup-timeout', 'Warmup timeout (s)', '0 < x <= 86400'],
    ['--dspark-schema', 'Default schema (JSON)', 'inline JSON Schema, or upload a file']
  ];

  function fmt(d) { return function (v) { return v == null ? '–' : Number(v).toFixed(d); }; }
  function secs(v) { return v == null ? '–' : (v < 1 ? (v * 1000).toFixed(0) + ' ms' : Number(v).toFixed(2) + ' s'); }
  function pct(v) { return v == null ? '–' : (v * 100).toFixed(1) + ' %'; }
  function el(tag, attrs, children) {
    var n = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === 'text') n.textContent = attrs[k];
      else if (k === 'class') n.className = attrs[k];
      else n.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c != null) n.appendChild(typeof c === 'string' ? document.createTextNode(c) : c); });
    return n;
  }
  function tag(text, kind) { return el('span', {'class': 'tag ' + (kind || ''), text: text}); }
  function isAdmin() {
    try { return JSON.parse(localStorage.getItem('gpustack:userInfo') || '{}').is_admin === true; } catch (e) { return false; }
  }

  function sparkline(points) {
    var values = (points || []).filter(function (p) { return p[1] != null; });
    if (values.length < 2) return el('div', {'class': 'nodata', text: values.length ? 'collecting…' : 'no data yet'});
    var t0 = values[0][0], t1 = values[values.length - 1][0] || t0 + 1;
    var vmax = Math.max.apply(null, values.map(function (p) { return p[1]; })) || 1;
    var d = values.map(function (p, i) {
      var x = ((p[0] - t0) / Math.max(t1 - t0, 1)) * 100, y = 34 - (p[1] / vmax) * 32;
      return (i ? 'L' : 'M') + x.toFixed(1) + ' ' + y.toFixed(1);
    }).join(' ');
    var svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svg.setAttribute('viewBox', '0 0 100 36');
    svg.setAttribute('preserveAspectRatio', 'none');
    var path = document.createElementNS('http://www.w3.org/2000/svg', 'path');
    path.setAttribute('d', d);
    path.setAttribute('vector-effect', 'non-scaling-stroke');
    svg.appendChild(path);
    return svg;
  }

  function phaseTag(r) {
    if (r.info_error) return tag('unreachable', 'warn');
    var kind = {warm: 'ok', warming: 'info', loading: 'info', failed: 'err'}[r.phase] || '';
    return tag(r.phase || '–', kind);
  }
  function stateTag(s) { return tag(s || '–', {running: 'ok', error: 'err'}[s] || 'info'); }

  function speculation(r) {
    if (r.speculation) {
      var keys = Object.keys(r.speculation).slice(0, 4);
      return keys.map(function (k) { return k + ': ' + JSON.stringify(r.speculation[k]); }).join(', ');
    }
    return r.speculative_length == null ? '–' : 'length ' + r.speculative_length + (r.method ? ' (' + r.method + ')' : '');
  }

  // Affinity routing at a replica: keys it holds, requests spilled in from a full home, its
  // prefix-cache hit rate and grammar compiles since it started.
  function affinity(a) {
    if (!a) return '–';
    var parts = [];
    if (a.keys != null) parts.push(a.keys + ' keys');
    if (a.spilled_in) parts.push(a.spilled_in + ' spilled in');
    if (a.prefix_cache_hit_rate != null) parts.push('prefix cache ' + Math.round(a.prefix_cache_hit_rate * 100) + '% hits');
    if (a.grammar_compiles != null) parts.push(a.grammar_compiles + ' grammar compiles');
    return parts.length ? parts.join(' · ') : '–';
  }

  function renderLive(d) {
    var stats = el('div', {'class': 'ds-stats'}, FIGURES.map(function (f) {
      return el('div', {'class': 'ds-stat', 'data-testid': 'figure-' + f[0]}, [
        el('div', {'class': 'label', text: f[1]}),
        el('div', {'class': 'value', text: f[2](d.figures[f[0]])}),
        sparkline(d.series[f[0]])
      ]);
    }));
    var rows = d.instances.map(function (r) {
      return el('tr', {'data-testid': 'replica-' + r.name}, [
        el('td', {text: r.name}), el('td', {}, [stateTag(r.state)]),
        el('td', {}, [phaseTag(r), el('div', {'class': 'muted', text: r.info_error || r.phase_reason || ''})]),
        el('td', {text: r.warmup_s == null ? '–' : Number(r.warmup_s).toFixed(1) + ' s'}),
        el('td', {'data-testid': 'in-flight', text: String(r.in_flight)}),
        el('td', {text: r.worker || '–'}), el('td', {'class': 'muted', text: speculation(r)}),
        el('td', {'data-testid': 'affinity', 'class': 'muted', text: affinity(r.affinity)})
      ]);
    });
    var table = rows.length ? el('table', {}, [
      el('thead', {}, [el('tr', {}, ['Replica', 'GPUStack state', 'Replica phase', 'Warmup', 'In flight', 'Worker',
        'Speculation', 'Affinity'].map(function (h) { return el('th', {text: h}); }))]),
      el('tbody', {}, rows)]) : el('div', {'class': 'ds-state', 'data-state': 'empty', text: 'No replicas yet.'});
    return el('div', {}, [
      el('div', {'class': 'muted', text: 'Totals: ' + (d.totals.format_errors || 0) + ' JSON format errors, ' +
        (d.totals.withheld || 0) + ' withheld replies; charts: the last hour, one point per sample.'}),
      el('h3', {text: 'Figures'}), stats, el('h3', {text: 'Replicas'}), table
    ]);
  }

  function rolloutView(r) {
    if (!r) return null;
    var kind = {rolling: 'info', done: 'ok', failed: 'err'}[r.state] || '';
    var steps = (r.replicas || []).map(function (x) { return x.id + ' ' + x.settings + (x.warm ? ' warm' : ' not warm'); });
    return el('div', {'class': 'ds-alert' + (r.state === 'failed' ? ' err' : ''), 'data-testid': 'rollout'}, [
      tag('rolling change: ' + r.state, kind), ' ', r.message || '',
      el('div', {'class': 'muted', text: 'restarted: ' + (r.restarted.length ? r.restarted.join(', ') : 'none yet') +
        (steps.length ? ' · ' + steps.join(' · ') : '')})
    ]);
  }

  function post(url, body) {
    return fetch(url, {method: 'POST', credentials: 'same-origin', headers: {'Content-Type': 'application/json'},
      body: JSON.stringify(body)}).then(function (r) {
      return r.json().catch(function () { return {message: 'HTTP ' + r.status}; })
        .then(function (j) { return {status: r.status, body: j}; });
    });
  }

  function buildEditor(d) {
    var box = el('div', {'data-testid': 'editor'});
    if (!isAdmin()) { box.appendChild(el('div', {'class': 'muted', text: 'Changing DSpark settings needs an admin.'})); return box; }
    var form = el('div', {'class': 'ds-form'});
    var inputs = {};
    KNOBS.forEach(function (k) {
      var flag = k[0];
      var current = d.knobs[flag];
      var input = flag === '--dspark-schema' ? el('textarea', {rows: '2'}) : el('input', {type: 'text'});
      input.value = current == null ? '' : current;
      input.setAttribute('placeholder', k[2]);
      input.setAttribute('data-flag', flag);
      input.setAttribute('data-testid', 'knob' + flag);
      var field = el('div', {'data-field': flag}, [el('label', {text: k[1] + ' (' + flag + ')'}), input,
        el('div', {'class': 'error', 'data-testid': 'error' + flag})]);
      if (flag === '--dspark-schema') {
        var file = el('input', {type: 'file', accept: '.json,application/json', 'data-testid': 'schema-file'});
        file.addEventListener('change', function () {
          var f = file.files && file.files[0];
          if (f) f.text().then(function (t) { input.value = t.trim(); });
        });
        field.appendChild(file);
      }
      inputs[flag] = input;
      form.appendChild(field);
    });
    var result = el('div', {'data-testid': 'editor-result'});
    var previewBtn = el('button', {type: 'button', text: 'Preview change'});
    var applyBtn = el('button', {type: 'button', 'class': 'primary', text: 'Apply as rolling change', disabled: 'disabled'});
    var previewed = null;

    function wanted() {
      var out = {};
      KNOBS.forEach(function (k) {
        var v = inputs[k[0]].value.trim(), cur = d.knobs[k[0]] == null ? '' : String(d.knobs[k[0]]);
        if (v !== cur) out[k[0]] = v === '' ? null : v;
      });
      return out;
    }
    function showErrors(errors) {
      KNOBS.forEach(function (k) {
        var field = form.querySelector('[data-field="' + k[0] + '"]');
        var msg = (errors || {})[k[0]] || '';
        field.className = msg ? 'has-error' : '';
        field.querySelector('.error').textContent = msg;
      });
    }
    function showAnswer(answer, applied) {
      result.innerHTML = '';
      showErrors(answer.body.errors);
      if (answer.status >= 400) {
        result.appendChild(el('div', {'class': 'ds-alert err', 'data-testid': 'editor-error',
          text: (answer.body.message || 'refused') + ' — nothing was changed.'}));
        return false;
      }
      var changes = answer.body.changes || [];
      if (!changes.length) { result.appendChild(el('div', {'class': 'ds-alert', text: 'No change.'})); return false; }
      result.appendChild(el('div', {'class': 'ds-diff', 'data-testid': 'diff'}, changes.map(function (c) {
        return el('div', {}, [c.flag + ': ', el('span', {'class': 'del', text: c.from == null ? '(default)' : c.from}),
          ' → ', el('span', {'class': 'add', text: c.to == null ? '(default)' : c.to})]);
      })));
      if (applied) result.appendChild(el('div', {'class': 'ds-alert', text: 'Applied; replicas restart one at a time.'}));
      return true;
    }
    previewBtn.addEventListener('click', function () {
      previewed = wanted();
      applyBtn.setAttribute('disabled', 'disabled');
      post(API + '/models/' + d.id + '/preview', {knobs: previewed}).then(function (a) {
        if (showAnswer(a, false) && !a.body.running_change) applyBtn.removeAttribute('disabled');
      }).catch(function (e) { result.textContent = 'Preview failed: ' + e; });
    });
    applyBtn.addEventListener('click', function () {
      applyBtn.setAttribute('disabled', 'disabled');
      post(API + '/models/' + d.id + '/apply', {knobs: previewed || wanted()}).then(function (a) {
        showAnswer(a, a.status === 202);
        refresh();
      }).catch(function (e) { result.textContent = 'Apply failed: ' + e; });
    });
    box.appendChild(form);
    box.appendChild(el('div', {'class': 'ds-buttons'}, [previewBtn, applyBtn,
      el('span', {'class': 'muted', text: 'Checked with the same messages as gpustack-dspark apply and the API; ' +
        'applied as GPUStack model update, then one replica at a time (never fewer than N-1 warm).'})]));
    box.appendChild(result);
    return box;
  }

  function renderDeployments(data) {
    var root = document.getElementById('deployments');
    var ds = data.deployments || [];
    if (!ds.length) {
      cards = {};
      root.innerHTML = '';
      root.appendChild(el('div', {'class': 'ds-state', 'data-state': 'empty'}, [
        data.sampler && data.sampler.last_sample_at ? 'No DSpark deployments. Deploy a model with the DSpark-custom backend from '
          : 'Collecting the first sample… ',
        el('a', {href: '/#/models/deployments', text: 'Deployments'}), '.']));
      return;
    }
    var seen = {};
    var empty = root.querySelector('.ds-state');
    if (empty) root.removeChild(empty);
    ds.forEach(function (d) {
      seen[d.id] = true;
      var c = cards[d.id];
      if (!c) {
        c = cards[d.id] = {root: el('section', {'class': 'ds-card', 'data-testid': 'deployment-' + d.name}),
          head: el('h2'), live: el('div'), rollout: el('div'), editor: buildEditor(d)};
        c.root.appendChild(c.head);
        c.root.appendChild(c.live);
        c.root.appendChild(el('h3', {text: 'DSpark settings'}));
        c.root.appendChild(c.rollout);
        c.root.appendChild(c.editor);
        root.appendChild(c.root);
      }
      c.head.innerHTML = '';
      c.head.appendChild(document.createTextNode(d.name));
      c.head.appendChild(tag(d.replicas_warm + ' / ' + (d.replicas_wanted || 0) + ' warm',
        d.replicas_warm >= (d.replicas_wanted || 0) ? 'ok' : 'warn'));
      c.head.appendChild(tag(d.in_flight + ' in flight', 'info'));
      c.live.innerHTML = '';
      c.live.appendChild(renderLive(d));
      c.rollout.innerHTML = '';
      var r = rolloutView(d.rollout);
      if (r) c.rollout.appendChild(r);
      if (d.rollout && d.rollout.state !== 'rolling' && c.rolledAt !== d.rollout.finished_at) {
        c.rolledAt = d.rollout.finished_at;   // the settings changed: a fresh editor with them
        var fresh = buildEditor(d);
        c.root.replaceChild(fresh, c.editor);
        c.editor = fresh;
      }
    });
    Object.keys(cards).forEach(function (id) {
      if (!seen[id]) { root.removeChild(cards[id].root); delete cards[id]; }
    });
  }

  function renderFeatures(features) {
    var box = document.getElementById('features');
    box.innerHTML = '';
    var names = Object.keys(features || {});
    if (!names.length) { box.appendChild(el('div', {'class': 'ds-state', 'data-state': 'empty', text: 'No features reported.'})); return; }
    box.appendChild(el('table', {'data-testid': 'features'}, [el('tbody', {}, names.map(function (n) {
      var f = features[n];
      return el('tr', {}, [el('td', {text: n}),
        el('td', {}, [tag(f.state, {enabled: 'ok', disabled: 'err', pending: 'info'}[f.state])]),
        el('td', {'class': 'muted', text: f.reason || ''})]);
    }))]));
  }

  function showNotice(text) {
    var n = document.getElementById('notice');
    n.innerHTML = '';
    if (text) n.appendChild(el('div', {'class': 'ds-state', 'data-state': 'error', 'data-testid': 'load-error', text: text}));
  }

  function refresh() {
    return fetch(API, {credentials: 'same-origin', headers: {Accept: 'application/json'}}).then(function (r) {
      if (r.status === 401) { window.location.href = '/#/login'; return null; }
      if (!r.ok) throw new Error('HTTP ' + r.status);
      return r.json();
    }).then(function (data) {
      if (!data) return;
      lastOk = Date.now();
      showNotice(data.sampler && data.sampler.error ? 'Sampling problem (figures may be stale): ' + data.sampler.error : '');
      renderDeployments(data);
      renderFeatures(data.features);
      document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
    }).catch(function (e) {
      showNotice('Could not load the DSpark console data: ' + e.message + (lastOk ? ' (showing the last figures)' : '') +
        '; retrying every ' + REFRESH_MS / 1000 + ' s.');
      if (!lastOk) {
        document.getElementById('deployments').innerHTML = '';
        document.getElementById('features').innerHTML = '';
      }
    });
  }

  refresh();
  window.setInterval(refresh, REFRESH_MS);
})();
