/* The book's layout on narrow screens, with custom.css.

   1. Each figure's image goes into a box of its own (.tfs-figure-scroll) and its natural
      width into the CSS variable --tfs-natural-width: on a phone, custom.css keeps the
      image at least a set share of that width, so that its text stays legible, and the
      box scrolls sideways when the image is wider than the screen (the caption stays).
   2. Every box that scrolls sideways (a code or output block, a display equation, a
      figure's box) and hides part of its content says so: data-tfs-more is "right",
      "left" or "both" while content lies past that edge, and custom.css fades that edge.
      A scrollbar would not tell: phones and macOS show none until one scrolls.

   tools/page_overflow.py measures the result in a browser. */
(() => {
  "use strict";
  const SCROLLERS =
    ".bd-article pre, .bd-article mjx-container[display='true'], .tfs-figure-scroll";

  const mark = (box) => {
    const hidden = box.scrollWidth - box.clientWidth;
    const left = hidden > 1 && box.scrollLeft > 1;
    const right = hidden > 1 && box.scrollLeft < hidden - 1;
    const more = left && right ? "both" : left ? "left" : right ? "right" : "";
    if (more) box.dataset.tfsMore = more;
    else delete box.dataset.tfsMore;
  };
  const markAll = () => document.querySelectorAll(SCROLLERS).forEach(mark);

  const boxFigures = () => {
    const images = document.querySelectorAll(
      ".bd-article .cell_output img, .bd-article figure img"
    );
    for (const img of images) {
      if (img.parentElement.classList.contains("tfs-figure-scroll")) continue;
      const box = document.createElement("div");
      box.className = "tfs-figure-scroll";
      img.replaceWith(box);
      box.appendChild(img);
      const natural = () => {
        if (!img.naturalWidth) return;
        img.style.setProperty("--tfs-natural-width", `${img.naturalWidth}px`);
        mark(box);
      };
      if (img.complete) natural();
      else img.addEventListener("load", natural, { once: true });
    }
  };

  // MathJax typesets the equations after the page is in, and its fonts come later still
  const settle = () => {
    markAll();
    const mathjax = window.MathJax && window.MathJax.startup;
    if (mathjax && mathjax.promise) mathjax.promise.then(markAll);
    if (document.fonts) document.fonts.ready.then(markAll);
  };

  const start = () => {
    boxFigures();
    settle();
    window.addEventListener("load", settle);
    window.addEventListener("resize", markAll);
    // the article's size changes as equations are typeset and folded cells open
    const article = document.querySelector(".bd-article");
    if (article && window.ResizeObserver) new ResizeObserver(markAll).observe(article);
    document.addEventListener(
      "scroll",
      (event) => {
        if (event.target instanceof Element && event.target.matches(SCROLLERS)) {
          mark(event.target);
        }
      },
      { capture: true, passive: true }
    );
  };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
