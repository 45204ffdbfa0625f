// Backpressure for a dashboard: answer every "ping" from the kernel with a "pong".
// The kernel counts unanswered pings and skips heavy updates while the page lags behind.
function render({ model, el }) {
  el.style.display = "none";
  const onMsg = (msg) => {
    if (msg && msg.ping !== undefined) {
      model.send({ pong: msg.ping });
    }
  };
  model.on("msg:custom", onMsg);
  model.send({ pong: 0, hello: true });
  return () => model.off("msg:custom", onMsg);
}

export default { render };
