#!/bin/bash
# No pager: when typed into an interactive terminal, git would otherwise wait in less/more.
export GIT_PAGER=cat GIT_EDITOR=true
cd /app/service
git merge feature/cache || true
printf '[server]\nport = 8000\nworkers = 8\n\n[cache]\nenabled = true\nbackend = redis\nttl_seconds = 300\n' > settings.ini
git add settings.ini
git commit --no-edit
git log --oneline --graph
