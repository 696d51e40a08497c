bench/accuracy/run --cases $2 --runs 40 --no-fail --json /work/acc-out/post_$1.json > /work/acc-out/post_$1.log 2>&1
