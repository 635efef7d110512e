/* The status page's charts (uPlot, served beside this file): drawn once, then fed the data
   each htmx poll brings in <script type="application/json" id="chart-data">. The chart
   boxes are hx-preserve'd, so a poll swaps the numbers, not the canvases. Every chart spans
   the page's time range (`from`..`to`); a null in a series is a gap in its line. */
(function () {
  "use strict";
  var plots = {};
  var latest = null;  /* the last chart data: the scales read their range from it */
  var blue = "#1a5fb4", green = "#1b7f3a", orange = "#a15c00", grey = "#555";

  function series(label, colour, dash) {
    return { label: label, stroke: colour, width: 2, dash: dash, spanGaps: false,
             points: { show: true, size: 4 } };
  }

  function specs(c) {
    var commits = [series("commits", blue)];
    var commitData = [c.minutes, c.commits];
    if (c.daemon) {
      commits.push(series("events received", orange), series("events applied", green, [6, 3]));
      commitData.push(c.events_received, c.events_applied);
    }
    return {
      "chart-commits": { series: commits, data: commitData },
      "chart-pending": { series: [series("pending changes", orange)],
                         data: [c.pending_times, c.pending] },
      "chart-latency": { series: [series("mean s", blue), series("p95 s", grey, [6, 3])],
                         data: [c.minutes, c.latency_mean_s, c.latency_p95_s] },
    };
  }

  function width(el) { return Math.max(el.clientWidth || 0, 300); }

  function draw() {
    var source = document.getElementById("chart-data");
    if (!source || typeof uPlot === "undefined") { return; }
    var c = JSON.parse(source.textContent);
    latest = c;
    var all = specs(c);
    Object.keys(all).forEach(function (id) {
      var el = document.getElementById(id), spec = all[id];
      if (!el || el.querySelector(".nodata")) { return; }  /* no daemon: nothing to draw */
      if (plots[id] && plots[id].root.isConnected) {
        plots[id].setData(spec.data);
        return;
      }
      el.textContent = "";
      plots[id] = new uPlot({
        width: width(el), height: 180, legend: { live: false },
        cursor: { drag: { x: false, y: false } },
        /* every chart spans the chosen range (a fresh page's one sample is not stretched
           over years), from zero up (one sample is not a 0-100 axis) */
        scales: { x: { time: true, range: function () { return [latest.from, latest.to]; } },
                  y: { range: function (u, min, max) {
                    return [0, max > 0 ? max * 1.1 : 1]; } } },
        axes: [{ stroke: grey }, { stroke: grey }],
        series: [{}].concat(spec.series),
      }, spec.data, el);
    });
    window.statusCharts = plots;  /* for the browser test */
  }

  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("htmx:afterSettle", draw);
  window.addEventListener("resize", function () {
    Object.keys(plots).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) { plots[id].setSize({ width: width(el), height: 180 }); }
    });
  });
})();
