/* gpustack-dspark: added to GPUStack's index.html by the plugin (console/index_inject.py).
 * Puts a "DSpark" entry in GPUStack's side menu (after "Inference Backends") and, in the
 * deploy form, a hint linking to the console when the DSpark backend is chosen.
 * GPUStack's own DOM is only read and appended to; every step is guarded, so a change in
 * GPUStack's markup means no entry, never a broken page. No network access of its own. */
(function () {
  'use strict';
  var MENU_ID = 'dspark-menu-entry';
  var HINT_ID = 'dspark-deploy-hint';
  var CONSOLE_URL = '/dspark/console';
  var ICON = '<svg viewBox="0 0 1024 1024" width="1em" height="1em" fill="currentColor" aria-hidden="true">' +
    '<path d="M576 64L192 576h256l-64 384 448-576H576l64-320z"></path></svg>';

  function addMenuEntry() {
    if (document.getElementById(MENU_ID)) return;
    var anchor = document.querySelector('a.menu-item[href="#/models/backends"]') ||
      document.querySelector('a.menu-item[href="#/models/deployments"]');
    if (!anchor || !anchor.parentElement) return;
    var item = anchor.parentElement.cloneNode(true);
    item.id = MENU_ID;
    var link = item.querySelector('a');
    link.className = link.className.replace(/\bmenu-item-selected\b/g, '').trim();
    link.setAttribute('href', CONSOLE_URL);
    link.setAttribute('data-dspark', 'menu');
    var icon = link.querySelector('.anticon');
    if (icon) icon.innerHTML = ICON;
    var title = link.querySelector('.menu-item-title');
    if (title) title.textContent = 'DSpark';
    else link.textContent = 'DSpark';
    anchor.parentElement.parentElement.insertBefore(item, anchor.parentElement.nextSibling);
  }

  // The backend field of GPUStack's deploy form (antd: the select around #deployModel_backend).
  function dsparkChosen(form) {
    var input = form.querySelector('#deployModel_backend');
    var select = input ? input.closest('.ant-select') : null;
    if (!select) return null;
    var shown = select.querySelector('[title]');
    var text = (shown && shown.getAttribute('title')) || select.textContent || '';
    return /DSpark/.test(text) ? select : null;
  }

  function updateDeployHint() {
    var form = document.querySelector('form#deployModel');
    var hint = document.getElementById(HINT_ID);
    var chosen = form ? dsparkChosen(form) : null;
    if (!chosen) {
      if (hint) hint.parentElement.removeChild(hint);
      return;
    }
    if (hint) return;
    var field = chosen.closest('.ant-form-item');
    if (!field || !field.parentElement) return;
    hint = document.createElement('div');
    hint.id = HINT_ID;
    hint.className = 'ant-alert ant-alert-info';
    hint.setAttribute('role', 'note');
    hint.style.cssText = 'margin:0 0 16px;padding:8px 12px;border-radius:6px;border:1px solid #91caff;' +
      'background:rgba(22,119,255,.06);font-size:13px;line-height:1.5;';
    hint.appendChild(document.createTextNode('DSpark backend: acceptance, warmup, JSON errors and safe changes of its ' +
      'knobs are in the '));
    var link = document.createElement('a');
    link.href = CONSOLE_URL;
    link.target = '_blank';
    link.rel = 'noopener';
    link.textContent = 'DSpark console';
    hint.appendChild(link);
    hint.appendChild(document.createTextNode('.'));
    field.parentElement.insertBefore(hint, field.nextSibling);
  }

  var scheduled = false;
  function run() {
    scheduled = false;
    try { addMenuEntry(); } catch (e) { /* GPUStack's markup changed: no entry */ }
    try { updateDeployHint(); } catch (e) { /* no hint */ }
  }
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    window.setTimeout(run, 100);
  }
  function start() {
    run();
    try {
      new MutationObserver(schedule).observe(document.body, { childList: true, subtree: true });
    } catch (e) { /* no observer: the entry is added once */ }
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
