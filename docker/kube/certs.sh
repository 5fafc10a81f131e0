#!/bin/sh
# One-shot (alpine): the kube-apiserver's serving certificate (self-signed, SAN kube-apiserver,
# also istiod's CA in docker/kube/kubeconfig) and its service-account signing key, into the
# shared `kube-pki` volume. Kept across `up`s; `docker compose down -v` removes them.
set -eu
cd /pki
if [ -s apiserver.crt ] && [ -s apiserver.key ] && [ -s sa.key ] && [ -s sa.pub ]; then
  echo "kube pki present"; exit 0
fi
apk add --no-cache openssl >/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=kube-apiserver" \
  -addext "subjectAltName=DNS:kube-apiserver,DNS:localhost,IP:127.0.0.1" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -keyout apiserver.key -out apiserver.crt
openssl genrsa -out sa.key 2048
openssl rsa -in sa.key -pubout -out sa.pub
chmod 0644 apiserver.crt apiserver.key sa.key sa.pub
echo "kube pki written"
