// A zero-latency application on 127.0.0.1 for the application-target benchmark
// (benches/compare_app_targets.py): a knowledge base with document upload and delete and a
// chat that answers from nothing — the gullible model of the test server (a PWNED-… token
// in the question is the answer, else "Sure. " and the question). Node's own http module,
// no dependency; it prints its base URL and serves until killed.
//
//   POST   /documents      {"title", "text"}   -> {"document": {"id": N}}
//   DELETE /documents/ID                       -> 204, or 404
//   POST   /chat           {"question"}        -> {"data": {"answer": "..."}}
//   POST   /classify       {"text", "role"}    -> {"flagged", "score", "category"}: a
//                                                 zero-latency guardrail (issue 55's bench,
//                                                 benches/compare_guardrail_http.py)
//   GET    /stats                              -> {"documents": N, "requests": N}
//
// Usage: node benches/app_server.js
'use strict';
const http = require('http');

const docs = new Map();
let next = 0;
let requests = 0;

function send(res, status, value) {
  if (value === undefined) {
    res.writeHead(status);
    res.end();
    return;
  }
  const body = JSON.stringify(value);
  res.writeHead(status, {'content-type': 'application/json', 'content-length': Buffer.byteLength(body)});
  res.end(body);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    if (req.url === '/stats') {
      send(res, 200, {documents: docs.size, requests});
      return;
    }
    requests += 1;
    let body = {};
    try {
      body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : {};
    } catch (e) {
      send(res, 400, {error: 'not JSON'});
      return;
    }
    if (req.method === 'POST' && req.url === '/documents') {
      next += 1;
      docs.set(next, String(body.text || ''));
      send(res, 200, {document: {id: next}});
    } else if (req.method === 'DELETE' && req.url.startsWith('/documents/')) {
      const id = Number(req.url.slice('/documents/'.length));
      send(res, docs.delete(id) ? 204 : 404);
    } else if (req.method === 'POST' && req.url === '/chat') {
      const q = String(body.question || '');
      const m = q.match(/PWNED-[A-Za-z0-9-]+/);
      send(res, 200, {data: {answer: m ? m[0] : 'Sure. ' + q}});
    } else if (req.method === 'POST' && req.url === '/classify') {
      const t = String(body.text || '').toLowerCase();
      const flagged = t.includes('ignore') || t.includes('instruction');
      send(res, 200, {flagged, score: flagged ? 0.9 : 0.1, category: flagged ? 'keyword' : null});
    } else {
      send(res, 404, {error: 'no such route'});
    }
  });
});
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`http://127.0.0.1:${server.address().port}\n`);
});
