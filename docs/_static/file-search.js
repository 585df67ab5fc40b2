// Opened from a file (file://), the browser refuses the requests with which Sphinx's search shows
// a summary of each page found (CORS), so the results there are the pages' titles, without those
// errors; served (python -m http.server -d site), the search shows the summaries too.
if (window.location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") {
  DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
}
