#!/bin/bash
chmod 750 /srv/app/run.sh
chmod 600 /srv/app/secret.key
chown -R www-data:www-data /srv/app/public
