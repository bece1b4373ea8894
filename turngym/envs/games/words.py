"""A built-in list of common five-letter English words, written for turngym's offline Wordle.

It is not derived from the official Wordle or LMRL-Gym lists (those come via
``turngym data download lmrl``); it only needs to be large enough for tests and quick runs.
"""

BUILTIN_WORDS = tuple(sorted(set("""
about above actor acute admit adopt adult after again agent agree ahead alarm album alert alike
alive allow alone along alter among anger angle angry apart apple apply arena argue arise array
aside asset audio avoid award aware badly baker basic beach began begin being below bench birth
black blade blame blank blind block blood board boost booth bound brain brand bread break breed
brick brief bring broad brown brush build built buyer cabin cable candy carry catch cause chain
chair chalk charm chart chase cheap check chest chief child chose civil claim class clean clear
climb clock close cloud coach coast could count court cover crack craft crane crash cream crime
cross crowd crown curve cycle daily dance dealt death debut delay depth doing doubt dozen draft
drama drank dream dress drill drink drive drove dying eager early earth eight elite empty enemy
enjoy enter entry equal error event every exact exist extra faith false fault fiber field fifth
fifty fight final first flash fleet floor fluid focus force forth forty forum found frame frank
fraud fresh front frost fruit fully funny giant given glass globe glory grace grade grain grand
grant grass great green gross group grown guard guess guest guide happy heart heavy hence hobby
horse hotel house human humor ideal image index inner input issue joint judge juice knife known
label large laser later laugh layer learn least leave legal lemon level light limit local logic
loose lower lucky lunch magic major maker march match maybe mayor medal media metal meter might
minor model money month moral motor mount mouse mouth movie music nerve never night noise north
novel nurse ocean offer often order other ought outer owner paint panel paper party peace phase
phone photo piano piece pilot pitch place plain plane plant plate point pound power press price
pride prime print prior prize proof proud prove queen quick quiet quite radio raise range rapid
ratio reach ready refer relax reply rider ridge right river robot rough round route royal rural
salad scale scene scope score sense serve seven shade shake shall shape share sharp sheep sheet
shelf shell shift shine shirt shock shoot short shown sight since skill sleep slide small smart
smile smoke solid solve sound south space spare speak speed spend spent spoke sport staff stage
stake stand start state steam steel stick still stock stone stood store storm story strip stuck
study stuff style sugar suite sunny super sweet table taken taste teach teeth thank theme there
thick thing think third those three threw throw tight timer title toast today topic total touch
tough tower toxic trace track trade train treat trend trial tribe trick tried truck truly trust
truth twice uncle under union unity until upper upset urban usage usual valid value video virus
visit vital voice waste watch water wheel where which while white whole whose woman world worry
worse worst worth would wound write wrong wrote yield young youth
""".split())))
