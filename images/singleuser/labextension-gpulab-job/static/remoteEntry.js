// "Run as Job..." in JupyterLab's file browser: a .py file or a notebook of hers, run as a
// gpulab job (POST {base_url}gpulab/jobs, the image's gpulab_job server extension, which
// runs `gpulab-job submit`). Written by hand as a JupyterLab federated extension, so the
// image needs no Node build: the module-federation container JupyterLab loads
// (window._JUPYTERLAB[name] with init(shareScope) and get(module)), taking JupyterLab's
// own @jupyterlab/* and @lumino/* modules from the share scope it passes to init.
var _JUPYTERLAB;
(function () {
  "use strict";
  _JUPYTERLAB = _JUPYTERLAB || {};
  var shared = null;

  function use(name) {  // JupyterLab's own copy of a module, from the share scope
    var versions = shared && shared[name];
    var keys = versions ? Object.keys(versions) : [];
    if (!keys.length) {
      return Promise.reject(new Error("gpulab-job: JupyterLab shares no " + name));
    }
    return Promise.resolve(versions[keys[keys.length - 1]].get())
      .then(function (factory) { return factory(); });
  }

  var RUNNABLE = /\.(py|ipynb)$/;

  function plugin(filebrowser, apputils, widgets, services, coreutils) {
    return {
      id: "gpulab-job:run-as-job",
      description: "Run a Python file or a notebook as a gpulab job",
      autoStart: true,
      requires: [filebrowser.IDefaultFileBrowser],
      activate: function (app, browser) {
        function chosen() {
          var first = browser.selectedItems().next();
          var item = first.done ? null : first.value;
          return item && item.type !== "directory" && RUNNABLE.test(item.path) ? item : null;
        }
        app.commands.addCommand("gpulab-job:run", {
          label: "Run as Job\u2026",
          caption: "Run it on GPUs of its own until it ends, with no notebook open " +
                   "(its output in ~/jobs/ID/)",
          isVisible: function () { return chosen() !== null; },
          execute: function () {
            var item = chosen();
            return item ? ask(item) : undefined;
          }
        });
        app.contextMenu.addItem({
          command: "gpulab-job:run",
          selector: '.jp-DirListing-item[data-isdir="false"]',
          rank: 3
        });

        function field(label, input) {
          var row = document.createElement("label");
          row.style.display = "block";
          row.style.margin = "0.5em 0";
          row.append(label, input);
          return row;
        }

        function ask(item) {
          var gpus = document.createElement("input");
          gpus.type = "number"; gpus.min = "0"; gpus.value = "1"; gpus.name = "gpus";
          gpus.className = "jp-mod-styled"; gpus.style.marginLeft = "0.5em";
          var limit = document.createElement("input");
          limit.name = "time"; limit.placeholder = "8h (empty: the lab's most)";
          limit.className = "jp-mod-styled"; limit.style.marginLeft = "0.5em";
          var wait = document.createElement("input");
          wait.type = "checkbox"; wait.name = "wait";
          var node = document.createElement("div");
          node.className = "gpulab-job-form";
          node.append(field("GPUs", gpus), field("Time limit", limit),
                      field(wait, " Wait in line if no GPU is free"));
          var body = new widgets.Widget({ node: node });
          body.getValue = function () {
            return { gpus: Number(gpus.value), time: limit.value.trim(), wait: wait.checked };
          };
          return apputils.showDialog({
            title: "Run " + item.name + " as a job",
            body: body,
            buttons: [apputils.Dialog.cancelButton(),
                      apputils.Dialog.okButton({ label: "Run" })]
          }).then(function (result) {
            if (!result.button.accept) {
              return;
            }
            var settings = services.ServerConnection.makeSettings();
            var url = coreutils.URLExt.join(settings.baseUrl, "gpulab/jobs");
            var request = { method: "POST",
                            body: JSON.stringify(Object.assign({ path: item.path },
                                                               result.value)) };
            return services.ServerConnection.makeRequest(url, request, settings)
              .then(function (response) {
                return response.json().then(function (said) { return tell(said); });
              });
          });
        }

        function tell(said) {
          var text = said.message || "";
          if (said.ok) {  // gpulab-job said where its output goes
            text += "\n\nYour hub home page says how it ended.";
          }
          var message = document.createElement("pre");
          message.className = "gpulab-job-said";
          message.style.whiteSpace = "pre-wrap";
          message.textContent = text;
          return apputils.showDialog({
            title: said.ok ? "Job " + said.id + " submitted" : "The job was not started",
            body: new widgets.Widget({ node: message }),
            buttons: [apputils.Dialog.okButton()]
          });
        }
      }
    };
  }

  _JUPYTERLAB["gpulab-job"] = {
    init: function (scope) { shared = scope; },
    get: function (module) {
      if (module !== "./extension") {
        return Promise.reject(new Error("gpulab-job has no module " + module));
      }
      return Promise.all([use("@jupyterlab/filebrowser"), use("@jupyterlab/apputils"),
                          use("@lumino/widgets"), use("@jupyterlab/services"),
                          use("@jupyterlab/coreutils")])
        .then(function (m) {
          var extension = { __esModule: true, default: [plugin.apply(null, m)] };
          return function () { return extension; };
        });
    }
  };
})();
