#!/bin/bash
tar -xzf /data/site-backup.tar.gz -C /srv/www --strip-components=1
