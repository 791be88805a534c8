#!/bin/bash
sed -i 's/^workers = .*/workers = 4/' /etc/myapp/config.ini
rm -f /root/.config/myapp/config.ini /etc/profile.d/myapp-dev.sh
sed -i '/^export MYAPP_/d' /root/.bashrc
bash -lc 'myapp show'
