// Starts Swagger UI on this service's own schema. validatorUrl null: no badge fetched from validator.swagger.io;
// queryConfigEnabled false: a ?url= or ?configUrl= in a link cannot point the page at a foreign schema.
"use strict";
window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
  deepLinking: true,
  validatorUrl: null,
  queryConfigEnabled: false,
});
