// The run page: figures and curves from the run's server-sent events (/runs/{id}/events, each
// event the run's live.json), its report once the run has ended. Charts are uPlot.
"use strict";

const runId = document.body.dataset.run;
const charts = {};

const pct = (v) => (v == null ? "" : `${(100 * v).toFixed(1)}%`);
const num = (v, digits) => (v == null ? "" : Number(v).toFixed(digits));
const text = (id, value) => { document.getElementById(id).textContent = value; };

// One series per metric of `task`, on the union of their steps (null where one has no point).
function byStep(evals, task, metrics) {
  const values = metrics.map(() => new Map());
  for (const r of evals) {
    const i = metrics.indexOf(r.metric);
    if (r.task === task && i >= 0) values[i].set(r.step, r.value);
  }
  const xs = [...new Set(values.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
  return [xs, ...values.map((m) => xs.map((x) => (m.has(x) ? m.get(x) : null)))];
}

function overTime(trace, key) {
  const t0 = trace.length ? trace[0].t : 0;
  return [trace.map((p) => p.t - t0), trace.map((p) => p[key])];
}

// One series per name found in any sample's `pick(sample)` object (tasks, processes).
function overTimeByName(trace, pick) {
  const t0 = trace.length ? trace[0].t : 0;
  const names = [...new Set(trace.flatMap((p) => Object.keys(pick(p) || {})))].sort();
  const series = names.map((n) => trace.map((p) => (pick(p) || {})[n] ?? null));
  return [names, [trace.map((p) => p.t - t0), ...series]];
}

const COLOURS = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#a16207"];
const mapValues = (o, f) => Object.fromEntries(Object.entries(o || {}).map(([k, v]) => [k, f(v)]));

function draw(id, data, labels, xLabel, yRange) {
  const el = document.getElementById(id);
  el.dataset.points = String(data[0].length);
  if (charts[id] && charts[id].series.length !== labels.length + 1) {  // a new task or process
    charts[id].destroy();
    delete charts[id];
  }
  if (charts[id]) { charts[id].setData(data); return; }
  if (!data[0].length) return;  // uPlot needs a first point to size its axes
  charts[id] = new uPlot({
    width: 420, height: 200,
    scales: { x: { time: false }, y: yRange ? { range: yRange } : {} },
    axes: [{ label: xLabel }, {}],
    series: [{ label: xLabel }, ...labels.map((label, i) => ({ label, stroke: COLOURS[i], spanGaps: true, points: { size: 4 } }))],
  }, data, el);
}

function update(live) {
  const state = document.getElementById("state");
  if (state.textContent === "submitted") { state.textContent = "running"; state.className = "state running"; }
  text("dataset", live.dataset ?? "");
  text("phase", live.phase ?? "");
  text("pretrain-step", live.pretrain_step ?? "");
  text("rl-step", live.rl_step ?? "");
  text("accuracy", pct(live.accuracy));
  text("pass1", pct(live.pass1));
  text("reward", num(live.reward, 3));
  text("policy-lag", num(live.policy_lag, 2));
  const rates = Object.values(live.messages_per_s || {});
  text("messages-per-s", rates.length ? rates.reduce((a, b) => a + b, 0).toFixed(1) : "0");
  const procs = document.getElementById("processes");
  procs.replaceChildren(...Object.entries(live.processes || {}).map(([name, p]) => {
    const span = document.createElement("span");
    span.className = p.alive ? "alive" : "dead";
    const usage = p.rss_mb != null ? ` ${p.cpu_percent}% CPU ${Math.round(p.rss_mb)} MB` : "";
    span.textContent = `${name}${usage}${p.restarts ? ` (restarted ${p.restarts}x)` : ""} · `;
    return span;
  }));
  const evals = live.evals || [], trace = live.trace || [];
  draw("chart-accuracy", byStep(evals, "all", ["greedy", "pass1"]), ["greedy", "pass@1"], "RL step", [0, 1]);
  draw("chart-reward", byStep(evals, "rl", ["reward"]), ["reward"], "RL step");
  draw("chart-pretrain-loss", byStep(evals, "pretrain", ["loss", "val_loss"]), ["train", "validation"], "step");
  draw("chart-rl-loss", byStep(evals, "rl", ["pg_loss", "value_loss", "kl"]), ["policy", "value", "KL"], "RL step");
  draw("chart-entropy", byStep(evals, "rl", ["entropy"]), ["entropy"], "RL step");
  draw("chart-lag", overTime(trace, "policy_lag"), ["mean lag"], "seconds");
  draw("chart-rate", overTime(trace, "messages_per_s"), ["messages/s"], "seconds");
  const [tasks, done] = overTimeByName(trace, (p) => p.completions);
  draw("chart-interactions", done, tasks, "seconds");
  const [names, cpu] = overTimeByName(trace, (p) => mapValues(p.processes, (v) => v[0]));
  draw("chart-cpu", cpu, names, "seconds");
  const [, rss] = overTimeByName(trace, (p) => mapValues(p.processes, (v) => v[1]));
  draw("chart-memory", rss, names, "seconds");
  document.body.dataset.updatedAt = String(live.updated_at ?? "");
}

async function ended(status) {
  const state = document.getElementById("state");
  state.textContent = status.state;
  state.className = `state ${status.state}`;
  if (status.idle_share != null) text("idle-share", num(status.idle_share, 3));
  const response = await fetch(`/ui/runs/${encodeURIComponent(runId)}/report`);
  if (response.ok) document.getElementById("report").innerHTML = await response.text();
  document.body.dataset.ended = "true";
}

const events = new EventSource(`/runs/${encodeURIComponent(runId)}/events`);
events.onmessage = (e) => update(JSON.parse(e.data));
events.addEventListener("end", (e) => { events.close(); ended(JSON.parse(e.data)); });
