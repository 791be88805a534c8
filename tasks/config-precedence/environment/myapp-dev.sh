# developer convenience, remove before release
export MYAPP_MODE=staging
