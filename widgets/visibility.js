// Tells the kernel whether the part of the page holding this (invisible) widget is on screen:
// its parent box intersects the viewport and the browser tab is not hidden. The kernel skips
// encoding and sending frames that nobody could see. One report per change, per view.
function render({ model, el }) {
  el.style.height = "0px";
  el.style.overflow = "hidden";
  const view = Math.random().toString(36).slice(2);
  let onScreen = true;
  let shown = null;
  const report = () => {
    const visible = onScreen && document.visibilityState !== "hidden";
    if (visible !== shown) {
      shown = visible;
      model.send({ view, visible });
    }
  };
  const observer = new IntersectionObserver((entries) => {
    onScreen = entries.some((e) => e.isIntersecting);
    report();
  });
  // el is attached to its box by the next frame: watch the box (the tiles), not this 0-px element
  const frame = requestAnimationFrame(() => observer.observe(el.parentElement || el));
  document.addEventListener("visibilitychange", report);
  return () => {
    cancelAnimationFrame(frame);
    observer.disconnect();
    document.removeEventListener("visibilitychange", report);
    try {
      model.send({ view, gone: true });
    } catch (e) {
      // the widget is being closed with its comm: nothing to tell
    }
  };
}

export default { render };
