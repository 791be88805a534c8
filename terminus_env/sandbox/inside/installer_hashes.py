"""SHA-256 of the files Python's installers write that Python runs at every start (installer_files.py says which and
how an editable finder is normalised first). Made by scripts/installer-hashes.py from the installers' releases; the
newest releases it covers: uv 0.13.9, virtualenv 21.15.14, setuptools 84.2.1. Rerun it after new releases."""

INSTALLER_HASHES = frozenset({
    # setuptools 60.9.2-62.4.0: _distutils_hack/__init__.py
    "026d425507ed93f30700abdf25056940cc15c7796b01b2863e1288520c1ac036",
    # virtualenv 21.7.0-21.15.0: _virtualenv.py
    "0278334cdcfab4c746b4416fbd5c2b6e7da937c81e132397d62c361d404ebe0e",
    # virtualenv 20.38.0-21.0.0: _virtualenv.py
    "02943e192823d75212f206e1f2991ac572119882683a95dfbb7a1b913d7b14b5",
    # setuptools 49.3.0: _distutils_hack/__init__.py
    "03b38d1d8d6e9e14d4f12116683368d472a943c75ffe99986304b7b8bba0189c",
    # setuptools 68.2.0-69.5.1: editable finder, normalised
    "04ad3eef1d1129b821d65361b797b78a846984a92c41b3a0daed1d7f21135c53",
    # setuptools 60.6.0-60.8.2: _distutils_hack/__init__.py
    "06c27ded9e7642a2d5d5ea432989050e91987b2d00cfdc5c0477f23cffda06b4",
    # virtualenv 21.15.7-21.15.8: _virtualenv.py
    "07584d2a5d13e0811eb567d78ed2aca0fb60e7defff59a01ca7a48d907bdea51",
    # virtualenv 20.0.8: _virtualenv.py as packaged, its scripts path not yet filled in
    "095a1099733d28c837bca584f5fb3eb3724e357f8846c015083dc6e9a7b985f3",
    # uv 0.1.0-0.1.1: _virtualenv.py
    # virtualenv 20.24.0-20.25.0: _virtualenv.py
    "0aeb86546345c1d0fada097536e35525714d5cdbcc2d8eb3f9912a955044fcff",
    # virtualenv 20.25.1-20.35.3: _virtualenv.py
    "0f20351ea7e90039c46d3fabdef991f28b1e3ff33eb13ee6f0d5cd21ea0e8b14",
    # virtualenv 20.23.1: _virtualenv.py
    "119e4eb9c1a39e6ffd220840844bd326fa1bd3acf2f1c9fa0612949aedc228a5",
    # setuptools 49.3.0-84.2.1: _distutils_hack/override.py
    "12efecf8d17a5486780aa774b5b6c0e70b56932d8864f35df1eb7a18bb759b3a",
    # setuptools 70.3.0-72.2.0: _distutils_hack/__init__.py
    "1542e30b6d07156f447ab4bcaec4a3a330feb93167d5dcaf548f6d6b2cdb852c",
    # setuptools 60.9.0-60.9.1: _distutils_hack/__init__.py
    "228181f268b46192561e7b9a3c57ff31483e10b2584f6494e5256feb86d5e674",
    # setuptools 56.0.0: _distutils_hack/__init__.py
    "322f93bf23a7b8ccd421cfeeb68129e66dccfc363a40b2d2917aa0e9ef30848f",
    # setuptools 71.0.0-84.2.1: editable finder, normalised
    "3b3412ec3b6727dca5309b8efa7d9f3a004c995a15dc7e935c162abe66f2f098",
    # setuptools 60.5.0: _distutils_hack/__init__.py
    "4513b154dbf2fa7776a1d0812e6d4396770a8e6f286000d30bf6694ff3294dd5",
    # virtualenv 21.4.0-21.6.1: _virtualenv.py
    "460589e83387d4dfe5fd84d41c5f6979599f5cd080983d73c832549161c80435",
    # setuptools 68.0.0-69.0.3: _distutils_hack/__init__.py
    "46849a60a7cc85189cf6b5ac62b3f135004862ce6a96540a81c95ef6fbc4dc3e",
    # setuptools 69.1.0-70.2.0: _distutils_hack/__init__.py
    "4bf5b0bc8f8af7ce7096e96f7167cf4f776f2cc0983f5c8f876ca780b3a67781",
    # setuptools 59.3.0-59.8.0: _distutils_hack/__init__.py
    "4c2531daa12158dcabb8bce3e03386640407dfd866d9f27fc0377dd2894d3a6a",
    # setuptools 62.5.0-67.8.0: _distutils_hack/__init__.py
    "4d27a48545b57dd137ae35376fcf326d2064271084a487960686f8704b94de4a",
    # setuptools 60.3.1: _distutils_hack/__init__.py
    "52c30c27c38334fa426ba8d8784f7bb5e15df8511387ec0d0fbca8772fa224c1",
    # setuptools 68.1.2: editable finder, normalised
    "547c420eb9fd87a162c290782919c25ed1dd030270938df62e0e27cbd09a0e22",
    # setuptools 56.1.0-59.2.0: _distutils_hack/__init__.py
    "5f7454880e8a04fa0499ca3f0a3002ca5b7241b15119552965101b4a43c6c0cb",
    # setuptools 60.2.0: _distutils_hack/__init__.py
    "600ff3472bad5c46ee6438a9516e844282c2e8fb946ef62c1b2060f9a2fe3c2b",
    # setuptools 64.0.0-65.1.0: editable finder, normalised
    "6746347f4c6616fd6c665e5978800e8e34c0bb000c1c3c78290a60794f06617d",
    # virtualenv 20.0.28-20.13.3: _virtualenv.py
    "684b8c07932ba4a84ac2e5ae9afe49ef04e92bac3d8d4191d455cf09d093e5fc",
    # uv 0.4.5-0.11.17: _virtualenv.py
    "6cf30c56faf2a55228914dbbd17f8088ed371ebb08f5e7fa6fd931f913fcaf1d",
    # setuptools 60.0.0-60.0.2: _distutils_hack/__init__.py
    "7688a23bb369b867ca503635e94c625981671c1e01adf621da6c59d2d07d5114",
    # virtualenv 20.0.10: _virtualenv.py
    "82944bb74841efbcfdc3539e7d60df63f43cc023041eb183abbd56f44e071b45",
    # setuptools 50.0.0: _distutils_hack/__init__.py
    "870913c1cb82e84d190b5b700c4cc71af16ace684b88e19b5f6149af7b833435",
    # setuptools 49.3.1-49.6.0: _distutils_hack/__init__.py
    "870c6f4869d409d7434c7ef7b99175568095b5541ac621538e5d8145fd01194f",
    # virtualenv 20.0.9: _virtualenv.py
    "889a24441371e5eed19bb3097dba76ad5c7ef8b093fdf8967d2e3e46f0fadbf6",
    # virtualenv 20.0.9: _virtualenv.py as packaged, its scripts path not yet filled in
    "96245d9e9c0b16fdcd99b470abe101863858120c9bf57752278ec4d7f9b09a94",
    # setuptools 73.0.0-73.0.1: _distutils_hack/__init__.py
    "9b737c2ccce2dad2e896acfb6285c708419121078c00231a5439a7647cdd72e4",
    # setuptools 50.0.2-50.0.3: _distutils_hack/__init__.py
    "9bc5b111a0a9cfbe403c5ca562f18a715571dfc12f7577a5123a4a32427112dc",
    # setuptools 74.0.0-75.3.4: _distutils_hack/__init__.py
    "a325c4f62f92a19daaa558088e4339afd78e14df40c20a7d51c9dc3a714dc237",
    # setuptools 60.1.0: _distutils_hack/__init__.py
    "a390f4d5ada584de84c5fed69fffd50fe43393401438d1615cdb9fd07e03c34a",
    # setuptools 65.3.0-68.0.0: editable finder, normalised
    "a5ebf78402432aa6f01fb735517c25f5461ec3f136ccfe754bb4482528142576",
    # setuptools 68.1.0: editable finder, normalised
    "af2cbbe39ccefb0ab0833fba3bb160c26b90b8b3dad241c92ad96eded447a107",
    # setuptools 65.1.1-65.2.0: editable finder, normalised
    "bb7f0c8a721111dc5dd88451bd20c97a6e840257768808f6568bd8fa394f29bc",
    # virtualenv 20.0.27: _virtualenv.py
    "bd9633de3d8122488d66fcfa0c7f0c9cd0b58e9147938ddf1f8fa76ca12b6ad5",
    # virtualenv 20.35.4-20.36.1: _virtualenv.py
    "bec6155ff7bfc88f8e79e481f27fd7ee0a3b40eeca9bfeb41f4c4b997b2f8100",
    # setuptools 50.2.0-54.2.0: _distutils_hack/__init__.py
    "c05b8045c9a51ed915db41df44195068c3d8ee1431f93104b670695decac8b02",
    # virtualenv 20.0.8: _virtualenv.py
    "c0dff4cc6bb71eea3c812b5eebc5b6d94498679d4e36de276190838663c32cd1",
    # virtualenv 20.16.3-20.21.1: _virtualenv.py
    "c9199315871b11b12df226f890a38e66e63191e1adbfb11a66e6861151b33fca",
    # setuptools 50.1.0: _distutils_hack/__init__.py
    "ccb3a83ef896531388f58fec08c15ee7998fa0a36b83196c374b74a7ca93022f",
    # virtualenv 20.13.4-20.16.2: _virtualenv.py
    "ce57d5e0d9b5d7356cb42da7450ba8f9359bdf693e335f4c921626943c77e64d",
    # setuptools 84.0.0-84.2.1: _distutils_hack/__init__.py
    "ced72e54431ecf2d8d7dbd8a1e27724f1b171af3ca1503c304bf11c59a7fe861",
    # uv 0.11.18-0.13.9: _virtualenv.py
    "cfb3db86aaa53bb62b5ff764970bec2d71c9228590a0ebec57f6ec926cc0bf1a",
    # virtualenv 21.15.10-21.15.14: _virtualenv.py
    "cfe56cafbd68fd31a0e87100f111d7d2f6b7157241096500013c07e88d80a22f",
    # virtualenv 21.15.9: _virtualenv.py
    "d762c207d745129f173766ffd8b96144bef46f5f87c174a7f684d9fa4248c2d5",
    # virtualenv 21.15.1-21.15.6: _virtualenv.py
    "dd8e633ed8b9f4741a52379f6d95cb2bf71cdf7d48aa43858935335efdd273ed",
    # setuptools 75.4.0-83.0.0: _distutils_hack/__init__.py
    "df81e6bcba34ee3e3952f776551fb669143b9490fdd6c4caeb32609f97e985b4",
    # setuptools 50.0.1: _distutils_hack/__init__.py
    "e1d21987df00de20d4729c8afacee31bec8bcd6d799092908249a6e3d6a5e3b2",
    # virtualenv 20.0.11-20.0.26: _virtualenv.py
    "e3db5fe06ab41ca9b95dd6463b83836787028a1b55562cc383803bb83001a45c",
    # uv 0.3.0-0.4.4: _virtualenv.py
    "e3e10c8a19a62a49928c139b8e6824eac92dcdda7639953bcd10921011cbbdff",
    # setuptools 60.4.0: _distutils_hack/__init__.py
    "e4a51d09fa11eb20b12a2861f82c5c5587ae4d3d096cf2d3246109b60991818d",
    # virtualenv 21.1.0-21.3.3: _virtualenv.py
    "e8c426ce260f866254ff35cefedc8b3efbd6d1446d99d7a4cdeb0095f98a8b8f",
    # uv 0.1.2-0.2.37: _virtualenv.py
    "ee52b2e2e720a40885a6b4b90c40e28e5c70e550af74d5efd169eaa5db2a6f6f",
    # setuptools 60.0.3-60.0.5: _distutils_hack/__init__.py
    "f0016db17603c3430ca7a444e28b1577445d9da7f7f32f746ed6820c3442a07d",
    # setuptools 70.0.0-70.3.0: editable finder, normalised
    "f3ab1d521c22c5b1c3e0bcb760c2947bfd5b7f1ed197d50497b7dc63ad841f6f",
    # virtualenv 20.22.0-20.23.0: _virtualenv.py
    "f4dfaeb9efc1614890cfa94ed15bbe9b2ee15fbe76d569ef5e435e93e4987dc7",
    # setuptools 60.1.1: _distutils_hack/__init__.py
    "fcc99a0fb405120ec879fd8f8d35f974134d4c88e5ec814d42cbb06442b22f17",
})
