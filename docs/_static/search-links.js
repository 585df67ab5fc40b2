// Sphinx's search writes each result's link relative to the site's root, where its own search page
// is. The Chinese pages' search page lives one folder down (zh/search.html): there, each result's
// link is made relative to the root (the page's content_root, "../") as it is added.
(function () {
  const root = document.documentElement.dataset.content_root;
  const results = document.getElementById("search-results");
  if (!root || root === "./" || !results) return;
  const rebase = function (link) {
    const href = link.getAttribute("href");
    if (href && !link.dataset.rebased && !/^([a-z]+:|\/|#|\.\.\/)/.test(href)) {
      link.setAttribute("href", root + href);
      link.dataset.rebased = "1";
    }
  };
  new MutationObserver(function () {
    results.querySelectorAll("a[href]").forEach(rebase);
  }).observe(results, { childList: true, subtree: true });
})();
