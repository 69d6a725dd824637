// A fetch that records what the client library read, for the schema checks
// on the Python side (same shape as tests/compat/capture.py's Exchange):
// the response body is teed, so the library still streams it as it arrives.

export function recordingFetch(log) {
  return async (input, init = {}) => {
    const url = typeof input === "string" ? input : input.url ?? String(input);
    const method = init.method ?? (typeof input === "object" && input.method) ?? "GET";
    const body = typeof init.body === "string" ? init.body : init.body ? Buffer.from(await new Response(init.body).arrayBuffer()).toString() : "";
    const res = await fetch(input, init);
    const entry = {
      method, url, request_body: Buffer.from(body).toString("base64"), status: res.status,
      headers: Object.fromEntries(res.headers.entries()), body: "", complete: false,
    };
    log.push(entry);
    if (!res.body) {
      entry.complete = true;
      return res;
    }
    const [forClient, forLog] = res.body.tee();
    entry.done = (async () => {
      const parts = [];
      for await (const part of forLog) parts.push(Buffer.from(part));
      entry.body = Buffer.concat(parts).toString("base64");
      entry.complete = true;
    })();
    return new Response(forClient, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

export async function finish(log) {
  await Promise.all(log.map((e) => e.done));
  return log.map(({ done, ...rest }) => rest);
}

export async function readConfig() {
  const parts = [];
  for await (const part of process.stdin) parts.push(part);
  return JSON.parse(Buffer.concat(parts).toString() || "{}");
}

// Run named cases; a case that throws is reported (name, message, stack), not fatal.
export async function runCases(cases, selected) {
  const results = {};
  for (const name of selected) {
    try {
      results[name] = await cases[name]();
    } catch (err) {
      results[name] = {
        error: `${err?.name}: ${err?.message}`, stack: String(err?.stack ?? ""),
        status: err?.status ?? err?.statusCode ?? null, code: err?.code ?? null, param: err?.param ?? null, type: err?.type ?? null,
      };
    }
  }
  return results;
}
