#!/usr/bin/env bash
# Smoke test of the gateway on a real cluster (kind, or any kubeconfig's current context), on the
# fake engine (no GPU): the replicas parked at 0, a request wakes them through the scale subresource
# (503 deployment_waking + Retry-After), then answers 200; idle for 60 s they are parked again.
#
#   kind create cluster && docker build -t streamproxy:latest --build-arg EXTRAS=kubernetes -f deploy/kubernetes/Dockerfile . \
#     && kind load docker-image streamproxy:latest && deploy/kubernetes/smoke.sh
#
# Leaves namespace `streamproxy-smoke` behind on failure for a look (kubectl delete ns streamproxy-smoke).
set -euo pipefail
NS=streamproxy-smoke
HERE="$(cd "$(dirname "$0")" && pwd)"
PORT="${PORT:-18080}"

kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
# The manifests, in the smoke namespace; the replica on the fake engine without a GPU; parking after 60 s.
sed "s/namespace: llm/namespace: $NS/" "$HERE/rbac.yaml" | kubectl apply -f -
sed -e "s/namespace: llm/namespace: $NS/" \
    -e 's/"--model", "Qwen\/Qwen3-8B"/"--engine", "fake"/' \
    -e '/nvidia.com\/gpu/d' -e 's/requests: {cpu: "4", memory: 32Gi}/requests: {cpu: 100m, memory: 256Mi}/' \
    -e 's/^\(\s*image: streamproxy:latest\).*/\1\n          imagePullPolicy: IfNotPresent/' \
    "$HERE/replica.yaml" | kubectl apply -f -
sed -e "s/namespace: llm/namespace: $NS/" -e 's/idle_park_after: 30m/idle_park_after: 60s/' -e 's/boot_guess: 120/boot_guess: 5/' \
    -e 's/^\(\s*image: streamproxy:latest\).*/\1\n          imagePullPolicy: IfNotPresent/' \
    "$HERE/gateway.yaml" | kubectl apply -f -
kubectl -n "$NS" rollout status deploy/streamproxy-gateway --timeout=180s

kubectl -n "$NS" port-forward svc/streamproxy-gateway "$PORT:80" >/dev/null 2>&1 &
FORWARD=$!
trap 'kill $FORWARD 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -fsS "http://127.0.0.1:$PORT/version" >/dev/null 2>&1 && break; sleep 0.2; done

BODY='{"model": "support-bot", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'
ask() { curl -sS -o /tmp/smoke-body -D /tmp/smoke-head -w '%{http_code}' -H 'Content-Type: application/json' \
          -d "$BODY" "http://127.0.0.1:$PORT/v1/chat/completions"; }

status=$(ask)
echo "first request: $status $(tr -d '\n' </tmp/smoke-body)"
[ "$status" = 503 ] && grep -q deployment_waking /tmp/smoke-body && grep -qi '^retry-after:' /tmp/smoke-head \
  || { echo "FAIL: expected 503 deployment_waking with Retry-After"; exit 1; }
echo "scale: $(kubectl -n "$NS" get deploy qwen3-8b -o jsonpath='{.spec.replicas}') (the gateway patched it)"

for i in $(seq 120); do
  status=$(ask)
  [ "$status" = 200 ] && break
  sleep "$(grep -i '^retry-after:' /tmp/smoke-head | tr -dc '0-9' || echo 2)"
done
[ "$status" = 200 ] || { echo "FAIL: no 200 after the wake"; exit 1; }
echo "answered: $(tr -d '\n' </tmp/smoke-body | head -c 300)"
curl -sS "http://127.0.0.1:$PORT/v1/deployments/support-bot"; echo

echo "waiting for the idle park (60 s)..."
for _ in $(seq 60); do
  [ "$(kubectl -n "$NS" get deploy qwen3-8b -o jsonpath='{.spec.replicas}')" = 0 ] && break
  sleep 2
done
[ "$(kubectl -n "$NS" get deploy qwen3-8b -o jsonpath='{.spec.replicas}')" = 0 ] || { echo "FAIL: not parked"; exit 1; }
echo "parked again. PASS"
kubectl delete namespace "$NS" --wait=false
