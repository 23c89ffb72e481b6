#!/usr/bin/env bash
# Regenerates the test certificates (valid for 100 years): a CA, and a server certificate
# it signed for localhost and 127.0.0.1. Test-only keys; never use them elsewhere.
set -euo pipefail
cd "$(dirname "$0")"
openssl req -x509 -newkey rsa:2048 -nodes -days 36500 -subj "/CN=Tidemark test CA" \
    -keyout ca.key -out ca.pem
openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 36500 \
    -extfile server.ext -out server.pem
rm -f server.csr server.ext ca.srl ca.key
