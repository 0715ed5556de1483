// A concretizer frame in 3D (templates/frame-3d.html): its points coloured by height or intensity,
// the voxels or occupied cells of one stride as translucent squares of their edge, and the labelled
// boxes as red wire frames with their type beside them. Everything comes from the viewer's JSON route
// (pipelines/viewer/concretizer.py, frame_view), never from the page. WebGL 1, two small shaders and
// an orbit camera written here: no library, so nothing to vendor and no import map to allow.
// Text from the data is only ever set as textContent: it never becomes markup or code.

const section = document.getElementById("frame-3d");
const canvas = document.getElementById("frame-3d-canvas");
const labels = document.getElementById("frame-3d-labels");
const colourBy = document.getElementById("colour-by");
const cellsMenu = document.getElementById("cells");
const say = (id, text) => { document.getElementById(id).textContent = text; };

const VERTEX = `
attribute vec3 position;
attribute float value;
uniform mat4 transform;
uniform float pointPx;
uniform float cellPx;
uniform vec2 span;
varying float shade;
void main() {
  gl_Position = transform * vec4(position, 1.0);
  gl_PointSize = cellPx > 0.0 ? clamp(cellPx / gl_Position.w, 2.0, 64.0) : pointPx;
  shade = clamp((value - span.x) / max(span.y - span.x, 1e-6), 0.0, 1.0);
}`;
const FRAGMENT = `
precision mediump float;
varying float shade;
uniform vec4 tint;
vec3 ramp(float t) {
  vec3 a = vec3(0.267, 0.005, 0.329), b = vec3(0.231, 0.322, 0.545), c = vec3(0.129, 0.569, 0.549);
  vec3 d = vec3(0.369, 0.788, 0.384), e = vec3(0.993, 0.906, 0.144);
  float s = t * 4.0;
  return s < 1.0 ? mix(a, b, s) : s < 2.0 ? mix(b, c, s - 1.0) : s < 3.0 ? mix(c, d, s - 2.0) : mix(d, e, s - 3.0);
}
void main() { gl_FragColor = tint.a > 0.0 ? tint : vec4(ramp(shade), 1.0); }`;
const BACKGROUND = [0.08, 0.1, 0.13], BOX = [0.88, 0.0, 0.0, 1.0], CELL = [1.0, 0.5, 0.05, 0.45];
const FOV = Math.PI / 4;

// -- matrices: column-major 4 x 4, as WebGL takes them
function perspective(aspect, near, far) {
  const f = 1 / Math.tan(FOV / 2);
  return [f / aspect, 0, 0, 0, 0, f, 0, 0, 0, 0, (far + near) / (near - far), -1, 0, 0, 2 * far * near / (near - far), 0];
}
function lookAt(eye, target) {
  const sub = (a, b) => a.map((v, i) => v - b[i]);
  const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];
  const unit = (a) => { const n = Math.hypot(...a) || 1; return a.map((v) => v / n); };
  const dot = (a, b) => a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
  const z = unit(sub(eye, target)), x = unit(cross([0, 0, 1], z)), y = cross(z, x);
  return [x[0], y[0], z[0], 0, x[1], y[1], z[1], 0, x[2], y[2], z[2], 0, -dot(x, eye), -dot(y, eye), -dot(z, eye), 1];
}
function multiply(a, b) {
  const out = new Array(16).fill(0);
  for (let c = 0; c < 4; c++) for (let r = 0; r < 4; r++) for (let k = 0; k < 4; k++) out[c * 4 + r] += a[k * 4 + r] * b[c * 4 + k];
  return out;
}

// -- the orbit camera: around the middle of the points (but their farthest 2 % each way), z up
const camera = { yaw: 0, pitch: 0, distance: 1, target: [0, 0, 0], home: null };
function aim(xyz) {
  const axis = (k) => { const v = []; for (let i = k; i < xyz.length; i += 3) v.push(xyz[i]); return percentiles(v, 0.02, 0.98); };
  const [x, y, z] = [0, 1, 2].map(axis);
  camera.home = { yaw: Math.PI + 0.6, pitch: 0.55, distance: 1.1 * Math.max(x[1] - x[0], y[1] - y[0], 1),
    target: [(x[0] + x[1]) / 2, (y[0] + y[1]) / 2, (z[0] + z[1]) / 2] };
  Object.assign(camera, camera.home, { target: [...camera.home.target] });
}
function transform() {
  const { yaw, pitch, distance, target } = camera;
  const eye = [target[0] + distance * Math.cos(pitch) * Math.cos(yaw), target[1] + distance * Math.cos(pitch) * Math.sin(yaw),
    target[2] + distance * Math.sin(pitch)];
  return multiply(perspective(canvas.width / canvas.height, distance / 100, distance * 10), lookAt(eye, target));
}

// -- WebGL
function program(gl) {
  const shader = (kind, text) => { const s = gl.createShader(kind); gl.shaderSource(s, text); gl.compileShader(s); return s; };
  const p = gl.createProgram();
  gl.attachShader(p, shader(gl.VERTEX_SHADER, VERTEX));
  gl.attachShader(p, shader(gl.FRAGMENT_SHADER, FRAGMENT));
  gl.linkProgram(p);
  if (!gl.getProgramParameter(p, gl.LINK_STATUS)) throw new Error(gl.getProgramInfoLog(p) || "the shaders did not link");
  return p;
}
function buffer(gl, data) {
  const b = gl.createBuffer();
  gl.bindBuffer(gl.ARRAY_BUFFER, b);
  gl.bufferData(gl.ARRAY_BUFFER, new Float32Array(data), gl.STATIC_DRAW);
  return b;
}
function boxLines(boxes) {
  // 12 edges and a heading tick (centre of the top to the middle of its front edge) per 7-value box
  const out = [];
  for (const { box: [x, y, z, dx, dy, dz, heading] } of boxes) {
    const c = Math.cos(heading), s = Math.sin(heading);
    const at = (u, v, w) => [x + (u * dx / 2) * c - (v * dy / 2) * s, y + (u * dx / 2) * s + (v * dy / 2) * c, z + w * dz / 2];
    const ring = [[1, 1], [1, -1], [-1, -1], [-1, 1]];
    ring.forEach(([u, v], i) => {
      const [u2, v2] = ring[(i + 1) % 4];
      out.push(...at(u, v, -1), ...at(u2, v2, -1), ...at(u, v, 1), ...at(u2, v2, 1), ...at(u, v, -1), ...at(u, v, 1));
    });
    out.push(...at(0, 0, 1), ...at(1, 0, 1));
  }
  return out;
}
function percentiles(values, lo, hi) {
  const sorted = Float32Array.from(values).sort();
  if (!sorted.length) return [0, 1];
  return [sorted[Math.floor(lo * (sorted.length - 1))], sorted[Math.floor(hi * (sorted.length - 1))]];
}

const gl = canvas.getContext("webgl", { antialias: true, preserveDrawingBuffer: true });
const scene = { points: null, count: 0, values: {}, spans: {}, boxes: [], boxLines: null, boxVertices: 0, cells: null,
  cellCount: 0, cellEdge: 0 };
let prog, queued = false;

function draw() {
  queued = false;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(canvas.clientWidth * dpr);
  canvas.height = Math.round(canvas.clientHeight * dpr);
  gl.viewport(0, 0, canvas.width, canvas.height);
  gl.clearColor(...BACKGROUND, 1);
  gl.clear(gl.COLOR_BUFFER_BIT | gl.DEPTH_BUFFER_BIT);
  const m = transform();
  const at = (name) => gl.getUniformLocation(prog, name);
  const position = gl.getAttribLocation(prog, "position"), value = gl.getAttribLocation(prog, "value");
  gl.uniformMatrix4fv(at("transform"), false, new Float32Array(m));
  gl.uniform1f(at("pointPx"), 2 * dpr);
  const bind = (b, where, size) => { gl.bindBuffer(gl.ARRAY_BUFFER, b); gl.enableVertexAttribArray(where); gl.vertexAttribPointer(where, size, gl.FLOAT, false, 0, 0); };
  gl.enable(gl.DEPTH_TEST);
  if (scene.points) {
    const by = colourBy.value;
    bind(scene.points, position, 3);
    bind(scene.values[by], value, 1);
    gl.uniform2fv(at("span"), scene.spans[by]);
    gl.uniform1f(at("cellPx"), 0);
    gl.uniform4fv(at("tint"), [0, 0, 0, 0]);
    gl.drawArrays(gl.POINTS, 0, scene.count);
    gl.disableVertexAttribArray(value);
  }
  if (scene.boxLines) {
    bind(scene.boxLines, position, 3);
    gl.uniform4fv(at("tint"), BOX);
    gl.drawArrays(gl.LINES, 0, scene.boxVertices);
  }
  if (scene.cells) {
    bind(scene.cells, position, 3);
    gl.uniform1f(at("cellPx"), scene.cellEdge * canvas.height / 2 / Math.tan(FOV / 2));
    gl.uniform4fv(at("tint"), CELL);
    gl.enable(gl.BLEND);
    gl.blendFunc(gl.SRC_ALPHA, gl.ONE_MINUS_SRC_ALPHA);
    gl.depthMask(false);
    gl.drawArrays(gl.POINTS, 0, scene.cellCount);
    gl.depthMask(true);
    gl.disable(gl.BLEND);
  }
  place(m);
  section.dataset.drawn = `${colourBy.value}|${cellsMenu.selectedOptions[0].dataset.view || ""}`;
}
function redraw() {
  if (!queued) { queued = true; requestAnimationFrame(draw); }
}
function place(m) {
  // each box's type beside the middle of its top, where that is in front of the camera
  const width = canvas.clientWidth, height = canvas.clientHeight;
  scene.boxes.forEach(({ box: [x, y, z, , , dz] }, i) => {
    const p = [0, 1, 2, 3].map((r) => m[r] * x + m[4 + r] * y + m[8 + r] * (z + dz / 2) + m[12 + r]);
    const tag = labels.children[i];
    tag.hidden = p[3] <= 0;
    tag.style.transform = `translate(${(p[0] / p[3] + 1) / 2 * width}px, ${(1 - p[1] / p[3]) / 2 * height}px)`;
  });
}

async function fetched(url) {
  const answer = await fetch(url, { credentials: "same-origin" });
  if (!answer.ok) throw new Error(`${url} answered ${answer.status}`);
  return answer.json();
}
async function loadPoints() {
  const data = await fetched(section.dataset.points);
  aim(data.xyz);
  const xyz = data.xyz, heights = [];
  for (let i = 2; i < xyz.length; i += 3) heights.push(xyz[i]);
  scene.points = buffer(gl, xyz);
  scene.count = data.shown;
  scene.values.height = buffer(gl, heights);
  scene.spans.height = percentiles(heights, 0.01, 0.99);
  if (data.intensity) {
    scene.values.intensity = buffer(gl, data.intensity);
    scene.spans.intensity = percentiles(data.intensity, 0.01, 0.99);
  }
  scene.boxes = data.boxes;
  scene.boxLines = buffer(gl, boxLines(data.boxes));
  scene.boxVertices = data.boxes.length * 26;
  labels.replaceChildren(...data.boxes.map((b) => { const tag = document.createElement("span"); tag.className = "box-label"; tag.textContent = b.type; return tag; }));
  say("points-shown", data.shown.toLocaleString("en"));
  say("points-note", data.shown < data.total
    ? ` of ${data.total.toLocaleString("en")}: a seeded subsample (the view draws at most ${Number(section.dataset.max).toLocaleString("en")})` : "");
}
async function loadCells() {
  const url = cellsMenu.value;
  section.dataset.state = "loading";
  if (!url) {
    scene.cells = null;
    say("cells-note", "");
  } else {
    const data = await fetched(url);
    if (url !== cellsMenu.value) return;                 // another choice was made meanwhile
    scene.cells = buffer(gl, data.xyz);
    scene.cellCount = data.shown;
    scene.cellEdge = Math.max(data.cell[0], data.cell[1]);
    say("cells-note", `; ${data.shown.toLocaleString("en")}${data.shown < data.total ? ` of ${data.total.toLocaleString("en")}` : ""} ${data.name}`);
  }
  section.dataset.state = "ready";
  redraw();
}
function failed(error) {
  section.dataset.state = "failed";
  say("points-note", ` could not be drawn: ${error.message}`);
}

function controls() {
  let drag = null;
  canvas.addEventListener("pointerdown", (e) => { drag = [e.clientX, e.clientY]; canvas.setPointerCapture(e.pointerId); });
  canvas.addEventListener("pointerup", () => { drag = null; });
  canvas.addEventListener("pointermove", (e) => {
    if (!drag) return;
    camera.yaw -= (e.clientX - drag[0]) * 0.01;
    camera.pitch = Math.min(1.5, Math.max(-1.5, camera.pitch + (e.clientY - drag[1]) * 0.01));
    drag = [e.clientX, e.clientY];
    redraw();
  });
  canvas.addEventListener("wheel", (e) => {
    e.preventDefault();
    camera.distance = Math.min(2000, Math.max(0.5, camera.distance * Math.exp(e.deltaY * 0.001)));
    redraw();
  }, { passive: false });
  document.getElementById("frame-3d-reset").addEventListener("click", () => {
    Object.assign(camera, camera.home, { target: [...camera.home.target] });
    redraw();
  });
  colourBy.addEventListener("change", redraw);
  cellsMenu.addEventListener("change", () => loadCells().catch(failed));
  window.addEventListener("resize", redraw);
}

if (!gl) {
  section.dataset.state = "no-webgl";
  say("points-note", ": this browser offers no WebGL, so the frame is shown only from above, below");
} else {
  try {
    prog = program(gl);
    gl.useProgram(prog);
    controls();
    loadPoints().then(loadCells).catch(failed);
  } catch (error) {
    failed(error);
  }
}
