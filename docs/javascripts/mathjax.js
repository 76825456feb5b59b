// MathJax typesets only what pymdownx.arithmatex marked (generic mode: \( \) inline, \[ \] display), so a
// dollar sign elsewhere on a page stays text. The pages write $...$ and $$...$$, which GitHub renders too.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};
