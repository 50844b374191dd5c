// The /docs page: Swagger UI when its files are served, else a plain rendering of /openapi.json.
"use strict";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function plain(spec) {
  const main = document.getElementById("openapi");
  main.hidden = false;
  main.append(el("h1", `${spec.info.title} ${spec.info.version}`));
  if (spec.info.summary) main.append(el("p", spec.info.summary));
  if (spec.info.description) main.append(el("p", spec.info.description));
  for (const [path, methods] of Object.entries(spec.paths || {})) {
    for (const [method, op] of Object.entries(methods)) {
      const section = el("section", undefined, "operation");
      section.append(el("h2", `${method.toUpperCase()} ${path}`));
      if (op.summary) section.append(el("p", op.summary));
      if (op.description) section.append(el("p", op.description));
      const body = op.requestBody && op.requestBody.content;
      if (body) {
        for (const [type, media] of Object.entries(body)) {
          section.append(el("h3", `Request body (${type})`));
          section.append(el("pre", JSON.stringify(media.schema, null, 2)));
        }
      }
      main.append(section);
    }
  }
  if (spec.components && spec.components.schemas) {
    main.append(el("h2", "Schemas"));
    for (const [name, schema] of Object.entries(spec.components.schemas)) {
      main.append(el("h3", name));
      main.append(el("pre", JSON.stringify(schema, null, 2)));
    }
  }
}

if (window.SwaggerUIBundle) {
  window.ui = window.SwaggerUIBundle({
    url: "/openapi.json", dom_id: "#swagger-ui", validatorUrl: null, deepLinking: false,
    presets: [window.SwaggerUIBundle.presets.apis], layout: "BaseLayout",
  });
} else {
  fetch("/openapi.json").then((r) => r.json()).then(plain).catch((err) => {
    const main = document.getElementById("openapi");
    main.hidden = false;
    main.append(el("p", `The API description could not be loaded: ${err}`));
  });
}
