#!/bin/bash
# Old and new heuristic picks of every shape whose pick changed (M N K oldBN oldS newBN newS).
b=.devbin/cur/ablate-0-k128
while read m n k ob os nb ns; do
  o=$(timeout 20 $b $m $n $k $ob $os | grep -o "[0-9.]* us$")
  w=$(timeout 20 $b $m $n $k $nb $ns | grep -o "[0-9.]* us$")
  echo "${m}x${n}x${k}: old 128x$ob split $os $o; new 128x$nb split $ns $w"
done < .devbin/changed.txt
