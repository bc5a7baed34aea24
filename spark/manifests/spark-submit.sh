#!/usr/bin/env bash
# Run a Capstan Spark job on Kubernetes with spark-submit (no spark-operator needed):
#   spark/manifests/spark-submit.sh compact Prices --server capstan-controller.capstan.svc:9876
#   spark/manifests/spark-submit.sh audit --server capstan-controller.capstan.svc:9876
# The driver runs in a pod of the capstan-spark image (spark/Dockerfile) under the
# capstan-spark service account (rbac.yaml) and starts the executors as pods.
# Environment: K8S_API (default: the current kubectl context's server), NAMESPACE
# (capstan), IMAGE (capstan-spark:0.1.0), EXECUTORS (2), SPARK_SUBMIT (spark-submit).
set -euo pipefail
if [[ $# -lt 1 || ! "$1" =~ ^(compact|audit)$ ]]; then
    echo "usage: $0 compact|audit [job arguments...]" >&2
    exit 2
fi
job=$1
shift
api=${K8S_API:-$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')}
exec "${SPARK_SUBMIT:-spark-submit}" \
    --master "k8s://$api" \
    --deploy-mode cluster \
    --name "capstan-$job" \
    --conf "spark.kubernetes.namespace=${NAMESPACE:-capstan}" \
    --conf "spark.kubernetes.container.image=${IMAGE:-capstan-spark:0.1.0}" \
    --conf spark.kubernetes.authenticate.driver.serviceAccountName=capstan-spark \
    --conf "spark.executor.instances=${EXECUTORS:-2}" \
    "local:///opt/capstan/jobs/$job.py" "$@"
