// aiogroupq dashboard: live refresh without reloading the page, and two
// conveniences for forms. The pages work without it (reload to refresh).
(() => {
  "use strict";
  const seconds = Number(document.body.dataset.refresh || 0);
  const status = document.getElementById("live-status");
  let busy = false;

  // A region the user is working in (a ticked box, a focused field) is left
  // alone until the next full page load: replacing it would undo their work.
  document.addEventListener("change", (event) => {
    const region = event.target.closest("[data-live]");
    if (region) region.dataset.dirty = "1";
  });

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(location.href, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { "X-Requested-With": "aiogroupq-refresh" },
        redirect: "error",
      });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const region of document.querySelectorAll("[data-live][id]")) {
        if (region.dataset.dirty || region.contains(document.activeElement)) continue;
        const replacement = fresh.getElementById(region.id);
        if (replacement) region.replaceWith(document.adoptNode(replacement));
      }
      if (status) {
        status.textContent = `live · ${new Date().toLocaleTimeString()}`;
        status.classList.remove("stale");
      }
    } catch (error) {
      if (status) {
        status.textContent = `not updating (${error.message})`;
        status.classList.add("stale");
      }
    } finally {
      busy = false;
    }
  }

  if (seconds > 0) {
    setInterval(refresh, seconds * 1000);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) refresh();
    });
  }

  // Ask before a destructive action (forms and buttons with data-confirm).
  document.addEventListener("submit", (event) => {
    const asking = event.submitter?.dataset.confirm || event.target.dataset.confirm;
    if (asking && !window.confirm(asking)) event.preventDefault();
  });

  // "Select all shown" in a table of checkboxes.
  document.addEventListener("change", (event) => {
    if (!event.target.classList.contains("select-all")) return;
    const table = event.target.closest("table");
    for (const box of table.querySelectorAll("tbody input[type=checkbox]")) {
      box.checked = event.target.checked;
    }
  });
})();
