#!/bin/bash
cd /opt/billing
sed -i -e 's/^PORT=.*/PORT=8080/' -e 's/^LOG_LEVEL=.*/LOG_LEVEL=debug/' .env
echo 'FEATURE_INVOICES=on' >> .env
