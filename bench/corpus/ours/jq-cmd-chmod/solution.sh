#!/bin/bash
# The command goes to cmd.sh first, so the saved command is the one that ran.
cat > /app/cmd.sh <<'CMD'
jq --indent 2 '[.[] | select(.status == "active") | {user_id: .id, username: .username, email: .email, last_login: (.last_login | split("T")[0]), role_count: (.roles | length)}] | sort_by(.username)' /app/users.json > /app/active_users_report.json
CMD
bash /app/cmd.sh
